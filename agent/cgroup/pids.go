package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PIDCapacity is how many processes the machine can have, as kubelet counts it for its "pid"
// resource: the smaller of kernel.pid_max and kernel.threads-max, read under root.
func PIDCapacity(root string) (int64, error) {
	var out int64
	for _, f := range []string{"pid_max", "threads-max"} {
		p := filepath.Join(root, "proc", "sys", "kernel", f)
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, err
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("%s: %q is not a positive number", p, strings.TrimSpace(string(b)))
		}
		if out == 0 || v < out {
			out = v
		}
	}
	return out, nil
}
