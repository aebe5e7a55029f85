package cgroup

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// Preflight is Check without changing anything, for `mqlet check`: the controllers pods need must
// be mounted (v1) or offered by the root cgroup (v2). Check also enables them down to cgroupRoot,
// which a preflight must not do; a host Preflight passes can still refuse there if a cgroup it does
// not own withholds a controller, and the agent's start says so naming that cgroup.
func (l Layout) Preflight() error {
	switch l.Mode {
	case Legacy, Hybrid:
		return l.checkV1()
	case Unified:
		avail, err := v2Controllers(l.Unified, "cgroup.controllers")
		if err != nil {
			return fmt.Errorf("cgroup %s: read the root's controllers: %w", l.Mode, err)
		}
		var missing, details []string
		for _, c := range required {
			if !slices.Contains(avail, c) {
				missing = append(missing, c)
				details = append(details, l.diagnose(c))
			}
		}
		if len(missing) > 0 {
			return &ControllerError{Mode: l.Mode, Missing: missing,
				Detail: fmt.Sprintf("%s has: %s. %s", filepath.Join(l.Unified, "cgroup.controllers"), strings.Join(avail, " "), strings.Join(details, " "))}
		}
		return nil
	}
	return l.Check("") // no cgroup file system: Check's refusal, and it touches nothing then
}
