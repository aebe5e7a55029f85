package ctrd

import "github.com/mqlet/mqlet/agent/ctrspec"

// SetObjects tells the runtime where ConfigMaps and Secrets are read; without it every reference
// to one is refused. Call it before any container starts.
func (r *Runtime) SetObjects(o ctrspec.Objects) { r.objects = o }

func (r *Runtime) objectsOrNone() ctrspec.Objects {
	if r.objects == nil {
		return ctrspec.NoObjects{}
	}
	return r.objects
}
