package ctrd

import (
	"fmt"
	"path/filepath"
	"strings"
)

const statusIDPrefix = "containerd://"

// StatusContainerID is a containerd container id as Kubernetes statuses carry it ("containerd://<id>").
func StatusContainerID(id string) string { return statusIDPrefix + id }

// TrimStatusContainerID is the containerd id in a status's containerID; a value without the prefix
// is returned as it is.
func TrimStatusContainerID(s string) string { return strings.TrimPrefix(s, statusIDPrefix) }

// checkPathElem refuses a value that would not stay one path element when joined: pod UIDs, names
// and volume names end up in paths, and one of them must never reach outside its directory.
func checkPathElem(what, s string) error {
	if s == "" || s == "." || s == ".." || len(s) > 253 || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("%s %q cannot be used in a file path", what, s)
	}
	return nil
}

// joinUnder joins elems under root, each of which must be a single path element.
func joinUnder(root string, elems ...string) (string, error) {
	for _, e := range elems {
		if err := checkPathElem("path element", e); err != nil {
			return "", err
		}
	}
	return filepath.Join(append([]string{root}, elems...)...), nil
}
