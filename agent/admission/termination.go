package admission

import (
	"path"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateTermination checks where a container's termination message goes (after defaulting): the
// API server's policy values, and an absolute path, since the runtime mounts a file there.
func validateTermination(c *v1.Container, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch c.TerminationMessagePolicy {
	case v1.TerminationMessageReadFile, v1.TerminationMessageFallbackToLogsOnError:
	default:
		errs = append(errs, field.NotSupported(p.Child("terminationMessagePolicy"), c.TerminationMessagePolicy,
			[]v1.TerminationMessagePolicy{v1.TerminationMessageReadFile, v1.TerminationMessageFallbackToLogsOnError}))
	}
	if mp := c.TerminationMessagePath; !path.IsAbs(mp) || path.Clean(mp) == "/" {
		errs = append(errs, field.Invalid(p.Child("terminationMessagePath"), mp, "must be an absolute path to a file"))
	}
	return errs
}
