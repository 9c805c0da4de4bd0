// Command radicd is the per-node radic daemon: protector, heartbeat ring
// member, critical-data store and metrics endpoint.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "radicd: not implemented yet")
	os.Exit(1)
}
