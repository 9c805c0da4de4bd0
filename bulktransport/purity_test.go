package bulktransport

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/radic-project/radic/internal/testenv"
)

// The protocol cores are pure (STYLE 1, 7): no sockets, files or
// syscalls, no goroutines, no wall clock. This test reads their source and
// fails on an import of net, os or syscall, a go statement, or a call of
// time.Now, time.Sleep, time.After, time.AfterFunc, time.NewTimer or
// time.NewTicker. netsim/udplink and bglayers (pcap files) are the I/O
// edges and are not checked.
func TestCoresArePure(t *testing.T) {
	root := testenv.Root(t)
	forbiddenImports := map[string]bool{"net": true, "os": true, "syscall": true, "golang.org/x/sys/unix": true}
	forbiddenTime := map[string]bool{"Now": true, "Sleep": true, "After": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Since": true, "Until": true, "Tick": true}
	for _, dir := range []string{"netsim", "bulktransport", "bulktransport/bulk", "bulktransport/deltat", "bulktransport/frag", "bulktransport/internal/seqnum", "bulktransport/internal/timerq"} {
		files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
		checked := 0
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			checked++
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, f)
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if forbiddenImports[p] {
					t.Errorf("%s imports %s: a protocol core does no I/O", rel, p)
				}
			}
			ast.Inspect(af, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.GoStmt:
					t.Errorf("%s starts a goroutine: a protocol core is driven by its caller", rel)
				case *ast.SelectorExpr:
					if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" && forbiddenTime[n.Sel.Name] {
						t.Errorf("%s calls time.%s: time is passed in", rel, n.Sel.Name)
					}
				}
				return true
			})
		}
		if checked == 0 {
			t.Errorf("no source in %s", dir)
		}
	}
}
