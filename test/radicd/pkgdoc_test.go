package radicd_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/radic-project/radic/internal/testenv"
)

// TestPackageDocs: every package of the radicd work has exactly one
// package doc comment.
func TestPackageDocs(t *testing.T) {
	root := testenv.Root(t)
	for _, dir := range []string{"heartbeat", "heartbeat/hbtest", "heartbeat/hbudp", "internal/radicd", "cmd/radicd", "test/radicd"} {
		pkgs, err := parser.ParseDir(token.NewFileSet(), filepath.Join(root, dir), nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		for name, p := range pkgs {
			if strings.HasSuffix(name, "_test") && name != "radicd_test" {
				continue
			}
			docs := 0
			for _, f := range p.Files {
				if f.Doc != nil && strings.HasPrefix(f.Doc.Text(), "Package ") || f.Doc != nil && strings.HasPrefix(f.Doc.Text(), "Command ") {
					docs++
				}
			}
			if docs != 1 {
				t.Errorf("%s (package %s): %d package doc comments, want 1", dir, name, docs)
			}
		}
	}
}
