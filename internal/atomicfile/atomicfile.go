// Package atomicfile replaces a small file whole: written beside it and renamed in, so a crash or a
// concurrent reader sees the old content or the new, never half of it. No fsync: callers whose
// files must survive power loss sync themselves (the state store does, through bbolt).
package atomicfile

import "os"

// Write writes data to path through path+".tmp" and a rename; the temporary file is removed when
// the rename fails.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
