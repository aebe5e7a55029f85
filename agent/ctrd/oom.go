package ctrd

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/hw"
	"golang.org/x/sys/unix"
)

// oomScoreFloor is the lowest oom_score_adj runc can set here. Without CAP_SYS_RESOURCE a process
// may not lower its score below what it inherited, and the container inherits the shim's, which
// is containerd's plus one; asking for less makes runc fail the container ("can't get final
// child's PID from pipe"). containerd's restrict_oom_score_adj clamps the same way for CRI.
// With the capability there is no floor.
func oomScoreFloor(containerdSocket string) (floor int, restricted bool, err error) {
	// What counts is containerd's capability (runc inherits it through the shim), not ours.
	const capSysResource = 24
	pid, err := socketPeerPid(containerdSocket)
	if err != nil {
		return 0, true, err
	}
	if hw.ProcessHasCapability(pid, capSysResource) {
		return -1000, false, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		return 0, true, err
	}
	score, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, true, fmt.Errorf("oom_score_adj of containerd (pid %d): %w", pid, err)
	}
	return min(score+1, 1000), true, nil
}

// socketPeerPid finds the process serving a unix socket (containerd) by its peer credentials.
func socketPeerPid(path string) (int, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("peer credentials of %s: %w", path, cerr)
	}
	return int(cred.Pid), nil
}
