//go:build !amd64

package hwbp

import (
	"fmt"
	"runtime"
)

func probe() (Result, error) {
	return Result{}, fmt.Errorf("hwbp: no breakpoint probe for %s", runtime.GOARCH)
}
