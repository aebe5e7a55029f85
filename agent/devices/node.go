package devices

import (
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"
)

// statDevice reads the node at host; anything but a character or block device is an error.
func statDevice(host string) (Node, error) {
	var st unix.Stat_t
	if err := unix.Lstat(host, &st); err != nil {
		return Node{}, &fs.PathError{Op: "stat", Path: host, Err: err}
	}
	n := Node{HostPath: host, Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)),
		Mode: fs.FileMode(st.Mode & 0o777), UID: st.Uid, GID: st.Gid}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		n.Type = "c"
	case unix.S_IFBLK:
		n.Type = "b"
	default:
		return Node{}, fmt.Errorf("%s is not a character or block device", host)
	}
	return n, nil
}
