// Package nft keeps the cluster's one nftables table: a bridge-family table
// named after the cluster, with one base chain per partition. The bridge
// family filters frames forwarded between the nodes' veth ports, so a
// partition is a set of drop rules between two sets of ports.
package nft

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// Family is the nftables family of the cluster's table.
const Family = "bridge"

func nft(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("nft: %s", msg)
	}
	return nil
}

// TableExists reports whether the table exists.
func TableExists(table string) bool {
	return exec.Command("nft", "list", "table", Family, table).Run() == nil
}

// CreateTable creates the (empty) table.
func CreateTable(table string) error {
	return nft(fmt.Sprintf("add table %s %s\n", Family, table))
}

// DeleteTable deletes the table and everything in it; a missing table is not
// an error.
func DeleteTable(table string) error {
	if !TableExists(table) {
		return nil
	}
	return nft(fmt.Sprintf("delete table %s %s\n", Family, table))
}

func set(ports []string) string {
	q := make([]string, len(ports))
	for i, p := range ports {
		q[i] = fmt.Sprintf("%q", p)
	}
	return "{ " + strings.Join(q, ", ") + " }"
}

// AddPartition adds chain, dropping every frame forwarded between a port
// of side a and a port of side b, in both directions.
func AddPartition(table, chain string, a, b []string) error {
	if len(a) == 0 || len(b) == 0 {
		return fmt.Errorf("nft: a partition needs ports on both sides")
	}
	script := fmt.Sprintf(`add chain %[1]s %[2]s %[3]s { type filter hook forward priority 0; policy accept; }
add rule %[1]s %[2]s %[3]s iifname %[4]s oifname %[5]s counter drop
add rule %[1]s %[2]s %[3]s iifname %[5]s oifname %[4]s counter drop
`, Family, table, chain, set(a), set(b))
	return nft(script)
}

// DeleteChain removes a partition; a missing table or chain is not an error.
func DeleteChain(table, chain string) error {
	if exec.Command("nft", "list", "chain", Family, table, chain).Run() != nil {
		return nil
	}
	return nft(fmt.Sprintf("delete chain %s %s %s\n", Family, table, chain))
}
