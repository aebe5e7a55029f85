package pods

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var topics = protocol.MustTopics("")

func ptr[T any](v T) *T { return &v }

// apiPod is a pod as kube-apiserver v1.37 returns it after its defaults and admission plugins
// (ServiceAccount, DefaultTolerationSeconds, Priority) ran, bound to node by the scheduler. The
// fields are those a `kubectl get pod -o yaml` of a Deployment's pod shows.
func apiPod(namespace, name, node string, uid types.UID) *v1.Pod {
	tok := "kube-api-access-" + strings.ToLower(string(uid)[:5])
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, UID: uid, Generation: 1, ResourceVersion: "4711",
			CreationTimestamp: metav1.NewTime(time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)),
			Labels:            map[string]string{"app": "web", "pod-template-hash": "5d8f9c7b6"},
			GenerateName:      "web-5d8f9c7b6-",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f9c7b6",
				UID: "11111111-2222-3333-4444-555555555555", Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{}}`)}},
		},
		Spec: v1.PodSpec{
			Volumes: []v1.Volume{
				{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
					LocalObjectReference: v1.LocalObjectReference{Name: "web-config"}, DefaultMode: ptr(int32(0o644))}}},
				{Name: tok, VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
					DefaultMode: ptr(int32(0o644)),
					Sources: []v1.VolumeProjection{
						{ServiceAccountToken: &v1.ServiceAccountTokenProjection{ExpirationSeconds: ptr(int64(3607)), Path: "token"}},
						{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
							Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
						{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "namespace",
							FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
					}}}},
			},
			Containers: []v1.Container{{
				Name: "httpd", Image: "127.0.0.1:5000/busybox:1.36", Command: []string{"httpd", "-f", "-p", "8080"},
				Env: []v1.EnvVar{{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
					LocalObjectReference: v1.LocalObjectReference{Name: "web-secret"}, Key: "token"}}}},
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")},
					Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}},
				VolumeMounts: []v1.VolumeMount{
					{Name: "config", MountPath: "/etc/web"},
					{Name: tok, ReadOnly: true, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"},
				},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: v1.TerminationMessageReadFile,
				ImagePullPolicy: v1.PullIfNotPresent,
			}},
			RestartPolicy:                 v1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: ptr(int64(30)),
			DNSPolicy:                     v1.DNSClusterFirst,
			ServiceAccountName:            "default",
			DeprecatedServiceAccount:      "default",
			NodeName:                      node,
			SecurityContext:               &v1.PodSecurityContext{},
			SchedulerName:                 "default-scheduler",
			Tolerations: []v1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
			},
			Priority:           ptr(int32(0)),
			EnableServiceLinks: ptr(true),
			PreemptionPolicy:   ptr(v1.PreemptLowerPriority),
		},
		Status: v1.PodStatus{
			Phase: v1.PodPending, QOSClass: v1.PodQOSBurstable,
			Conditions: []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(time.Date(2026, 3, 14, 9, 0, 1, 0, time.UTC))}},
		},
	}
}

func configMap(namespace, name string, data map[string]string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID("cm-" + name), ResourceVersion: "1"},
		Data: data}
}

func secret(namespace, name string, data map[string][]byte) *v1.Secret {
	return &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID("s-" + name), ResourceVersion: "1"},
		Data: data, Type: v1.SecretTypeOpaque}
}

// memBroker is an in-memory broker for unit tests: retained messages by topic and a log of
// publishes. Snapshot matches exact topics and filters ending in "/#".
type memBroker struct {
	mu       sync.Mutex
	retained map[string][]byte
	log      []string // topics published, in order
	fail     error
	// onSnapshot, when set, may change what a Snapshot returns (a read that lost messages); it
	// runs with the broker locked.
	onSnapshot func(filters []string, out map[string][]byte)
}

func newMemBroker() *memBroker { return &memBroker{retained: map[string][]byte{}} }

func (b *memBroker) Publish(ctx context.Context, topic string, payload []byte, retained bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return b.fail
	}
	b.log = append(b.log, topic)
	if retained {
		if len(payload) == 0 {
			delete(b.retained, topic)
		} else {
			b.retained[topic] = append([]byte(nil), payload...)
		}
	}
	return nil
}

func (b *memBroker) Snapshot(ctx context.Context, filters ...string) (map[string][]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string][]byte{}
	for t, p := range b.retained {
		for _, f := range filters {
			if t == f || strings.HasSuffix(f, "/#") && strings.HasPrefix(t, strings.TrimSuffix(f, "#")) {
				out[t] = p
			}
		}
	}
	if b.onSnapshot != nil {
		b.onSnapshot(filters, out)
	}
	return out, nil
}

func (b *memBroker) get(topic string) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retained[topic]
}

// waitFor polls cond until it holds or the bounded wait ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustEncode(t *testing.T, v any) []byte {
	t.Helper()
	b, err := protocol.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func desiredOf(t *testing.T, b []byte, node string, kind protocol.ObjectKind, ns, name string) *protocol.DesiredObject {
	t.Helper()
	if b == nil {
		t.Fatalf("no retained %s %s/%s on node %s", kind, ns, name, node)
	}
	d, err := protocol.DecodeDesired(protocol.Topic{Class: protocol.ClassDesired, Node: node, Kind: kind, Namespace: ns, Name: name}, b, 0)
	if err != nil {
		t.Fatalf("decode %s %s/%s: %v", kind, ns, name, err)
	}
	return d
}

// sealedNode is an API Node with the sealing key its agent publishes, and that key.
func sealedNode(t *testing.T, name string) (*v1.Node, *sealing.Key) {
	t.Helper()
	key, err := sealing.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{sealing.AnnotationKey: key.Public()}}}, key
}
