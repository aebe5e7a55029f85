package admission

import (
	"strings"
	"unicode"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateImageVolumes checks image volumes as the API server does: a reference without
// whitespace and a known pull policy (defaulted before).
func validateImageVolumes(spec *v1.PodSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, v := range spec.Volumes {
		if v.Image == nil {
			continue
		}
		p := path.Child("volumes").Index(i).Child("image")
		switch ref := v.Image.Reference; {
		case ref == "":
			errs = append(errs, field.Required(p.Child("reference"), "the image to mount"))
		case strings.IndexFunc(ref, unicode.IsSpace) >= 0:
			errs = append(errs, field.Invalid(p.Child("reference"), ref, "must not contain whitespace"))
		}
		switch v.Image.PullPolicy {
		case v1.PullAlways, v1.PullIfNotPresent, v1.PullNever:
		default:
			errs = append(errs, field.NotSupported(p.Child("pullPolicy"), v.Image.PullPolicy,
				[]v1.PullPolicy{v1.PullAlways, v1.PullIfNotPresent, v1.PullNever}))
		}
	}
	return errs
}
