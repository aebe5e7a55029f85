package pods

import (
	"context"
	"testing"

	"github.com/mqlet/mqlet/core/svcenv"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(ns, name, ip string, port int32) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"},
		Spec: v1.ServiceSpec{ClusterIP: ip, Ports: []v1.ServicePort{{Port: port, Protocol: v1.ProtocolTCP}}}}
}

// The pods sent to a node carry their service variables (enableServiceLinks) as kubelet picks them,
// a user's annotation of that name is replaced, and a Service's change reaches the pods of its
// namespace (and of every namespace for default/kubernetes).
func TestPodsCarryTheirServiceEnv(t *testing.T) {
	const node = "edge-a"
	links := apiPod("app", "web-1", node, "0a000000-0000-0000-0000-000000000001")
	links.Annotations = map[string]string{svcenv.Annotation: `{"FORGED":"x"}`}
	nolinks := apiPod("app", "web-2", node, "0a000000-0000-0000-0000-000000000002")
	nolinks.Spec.EnableServiceLinks = ptr(false)
	h := start(t, []string{node}, links, nolinks,
		service("default", "kubernetes", "10.96.0.1", 443),
		service("app", "foo", "10.96.0.5", 80),
		service("app", "db", v1.ClusterIPNone, 5432),
		service("other", "bar", "10.96.0.6", 80))
	h.c.NodeServed(node)

	envOf := func(name string) map[string]string {
		t.Helper()
		d := h.desired(node, protocol.KindPod, "app", name)
		env, err := svcenv.FromPod(d.Pod)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	env := envOf("web-1")
	for k, want := range map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "FOO_SERVICE_HOST": "10.96.0.5",
		"FOO_PORT_80_TCP": "tcp://10.96.0.5:80", "FORGED": "", "DB_SERVICE_HOST": "", "BAR_SERVICE_HOST": ""} {
		if env[k] != want {
			t.Errorf("web-1: %s=%q, want %q", k, env[k], want)
		}
	}
	env = envOf("web-2")
	if env["KUBERNETES_SERVICE_HOST"] != "10.96.0.1" || env["FOO_SERVICE_HOST"] != "" {
		t.Errorf("web-2 (enableServiceLinks false): %v, want the master service's variables only", env)
	}

	ctx := context.Background()
	svcs := h.kube.CoreV1().Services("app")
	foo, _ := svcs.Get(ctx, "foo", metav1.GetOptions{})
	before := h.broker.get(topics.Desired(node, protocol.KindPod, "app", "web-1"))
	foo.Labels, foo.ResourceVersion = map[string]string{"x": "y"}, "2"
	if _, err := svcs.Update(ctx, foo, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	foo.Spec.Ports[0].Port, foo.ResourceVersion = 81, "3"
	h.after("node", node, func() {
		if _, err := svcs.Update(ctx, foo, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	waitFor(t, "web-1 sent again with FOO_SERVICE_PORT 81", func() bool {
		b := h.broker.get(topics.Desired(node, protocol.KindPod, "app", "web-1"))
		if string(b) == string(before) {
			return false
		}
		env, err := svcenv.FromPod(desiredOf(t, b, node, protocol.KindPod, "app", "web-1").Pod)
		return err == nil && env["FOO_SERVICE_PORT"] == "81"
	})

	m := service("default", "kubernetes", "10.96.0.1", 6443)
	m.ResourceVersion = "2"
	if _, err := h.kube.CoreV1().Services("default").Update(ctx, m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web-2 sent again with the master service's new port", func() bool {
		b := h.broker.get(topics.Desired(node, protocol.KindPod, "app", "web-2"))
		env, err := svcenv.FromPod(desiredOf(t, b, node, protocol.KindPod, "app", "web-2").Pod)
		return err == nil && env["KUBERNETES_SERVICE_PORT"] == "6443"
	})
}
