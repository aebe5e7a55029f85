package hw

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// HugePages lists the kernel's huge page pools from root/sys/kernel/mm/hugepages: page size in
// bytes -> pages in the pool (nr_hugepages), as kubelet reads them for the node's hugepages-<size>
// capacity. A machine without huge page support has no such directory: no pools, no error.
func HugePages(root string) (map[int64]int64, error) {
	dir := filepath.Join(root, "sys/kernel/mm/hugepages")
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("huge page pools: %w", err)
	}
	out := map[int64]int64{}
	for _, e := range entries {
		// hugepages-2048kB, hugepages-1048576kB, hugepages-64kB (arm64 with 4k pages has 64kB,
		// 2MB, 32MB and 1GB pools).
		kb, ok := strings.CutSuffix(strings.TrimPrefix(e.Name(), "hugepages-"), "kB")
		if !ok || !strings.HasPrefix(e.Name(), "hugepages-") {
			continue
		}
		size, err := strconv.ParseInt(kb, 10, 64)
		if err != nil || size <= 0 {
			continue
		}
		rel := filepath.Join("sys/kernel/mm/hugepages", e.Name(), "nr_hugepages")
		v, ok := readValue(root, rel)
		if !ok {
			return out, fmt.Errorf("huge page pool %s: %s unreadable", e.Name(), rel)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return out, fmt.Errorf("huge page pool %s: %s holds %q, not a page count", e.Name(), rel, v)
		}
		out[size<<10] = n
	}
	return out, nil
}
