package ctrd

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/mqlet/mqlet/internal/atomicfile"
	v1 "k8s.io/api/core/v1"
)

// bootMarkerHook records in the pod dir the boot the sandbox was set up in. A different boot means
// the sandbox is new even when no namespace says so (hostNetwork pods). A missing marker (a pod dir
// made by an older mqlet) is trusted as intact: otherwise an upgrade would restart every pod.
type bootMarkerHook struct{}

func (bootMarkerHook) Name() string { return "boot marker" }

const bootIDFile = "/proc/sys/kernel/random/boot_id"

func (bootMarkerHook) Prerun(_ context.Context, _ *v1.Pod, sb *Sandbox) error {
	boot := bootID() // "-" on an odd kernel without one: then the namespaces alone tell a new sandbox
	marker := filepath.Join(sb.Dir, "boot_id")
	old, err := os.ReadFile(marker)
	if err == nil && strings.TrimSpace(string(old)) == boot {
		return nil
	}
	if err == nil {
		sb.Created = true
	}
	return atomicfile.Write(marker, []byte(boot+"\n"), 0o640)
}
