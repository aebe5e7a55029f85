package ctrd

import (
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/svcenv"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A downwardAPI volume shows the pod's annotations as kubelet's would: without the service
// variables the bridge sends in svcenv.Annotation (a Service change must not change the file).
func TestDownwardAnnotationsHideServiceEnv(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		"note": "hello", svcenv.Annotation: `{"FOO_SERVICE_HOST":"10.0.0.1"}`}}}
	got, err := volumePodField(pod, "metadata.annotations")
	if err != nil {
		t.Fatal(err)
	}
	if got != `note="hello"` {
		t.Errorf("metadata.annotations = %q, want only note", got)
	}
	if got, _ := volumePodField(pod, "metadata.annotations['"+svcenv.Annotation+"']"); strings.Contains(got, "FOO") {
		t.Errorf("the annotation is shown by key: %q", got)
	}
}
