package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/svcenv"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestServiceLinksEnv: a pod on the edge node gets the service environment variables kubelet gives
// (enableServiceLinks): those of its namespace's Services with a cluster IP and of
// default/kubernetes; with enableServiceLinks false only the latter. The container prints its
// environment at start, read back through the agent's API. A Service created afterwards reaches
// the node with the pod but restarts no container (kubelet reads the variables at container start).
func TestServiceLinksEnv(t *testing.T) {
	w := newEdgeWorld(t)
	w.startBridge(t, "bridge-a")
	w.startAgent(t)
	ctx := context.Background()
	core := w.kube.CoreV1()

	ns := uniqueName("svc")
	if _, err := core.Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	t.Cleanup(func() { core.Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	// The API server makes default/kubernetes itself.
	var master *v1.Service
	within(t, readyBound, "the API server's default/kubernetes Service", func() (bool, string) {
		var err error
		master, err = core.Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return master.Spec.ClusterIP != "", "no cluster IP yet"
	})
	mkSvc := func(namespace, name string, headless bool, ports ...v1.ServicePort) *v1.Service {
		t.Helper()
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ServiceSpec{Ports: ports, Selector: map[string]string{"app": name}}}
		if headless {
			s.Spec.ClusterIP = v1.ClusterIPNone
		}
		got, err := core.Services(namespace).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create service %s/%s: %v", namespace, name, err)
		}
		return got
	}
	foo := mkSvc(ns, "foo-svc", false, v1.ServicePort{Name: "http", Port: 8080, Protocol: v1.ProtocolTCP},
		v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP})
	mkSvc(ns, "db", true, v1.ServicePort{Port: 5432})                                        // headless: no variables
	mkSvc(metav1.NamespaceDefault, uniqueName("elsewhere"), false, v1.ServicePort{Port: 80}) // another namespace's

	off := false
	envPod := func(name string, links *bool) *v1.Pod {
		p := edgePod(name)
		p.Spec.EnableServiceLinks = links
		p.Spec.Containers[0].Command = []string{"sh", "-c", `env | sort; echo END-OF-ENV; trap "exit 0" TERM; while true; do sleep 1; done`}
		// kubelet's $(VAR) expansion reaches the service variables, the container's own win.
		p.Spec.Containers[0].Env = []v1.EnvVar{
			{Name: "FOO_URL", Value: "http://$(FOO_SVC_SERVICE_HOST):$(FOO_SVC_SERVICE_PORT_HTTP)"},
			{Name: "FOO_SVC_PORT", Value: "mine"},
		}
		if _, err := core.Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s/%s: %v", ns, name, err)
		}
		return p
	}
	withLinks, without := uniqueName("links"), uniqueName("nolinks")
	envPod(withLinks, nil) // the API defaults enableServiceLinks to true
	envPod(without, &off)

	envOf := func(pod string) map[string]string {
		t.Helper()
		var out string
		within(t, runBound, "pod "+ns+"/"+pod+" printed its environment", func() (bool, string) {
			var err error
			out, err = w.containerLog(ns, pod, "main")
			if err != nil {
				return false, err.Error()
			}
			return strings.Contains(out, "END-OF-ENV"), out
		})
		env := map[string]string{}
		for _, l := range strings.Split(out, "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				env[k] = v
			}
		}
		return env
	}

	ip, mip := foo.Spec.ClusterIP, master.Spec.ClusterIP
	mport := func() string {
		for _, p := range master.Spec.Ports {
			if p.Name == "https" {
				return itoa(p.Port)
			}
		}
		return itoa(master.Spec.Ports[0].Port)
	}()
	masterWant := map[string]string{
		"KUBERNETES_SERVICE_HOST":                 mip,
		"KUBERNETES_SERVICE_PORT":                 mport,
		"KUBERNETES_SERVICE_PORT_HTTPS":           mport,
		"KUBERNETES_PORT":                         "tcp://" + mip + ":" + mport,
		"KUBERNETES_PORT_" + mport + "_TCP":       "tcp://" + mip + ":" + mport,
		"KUBERNETES_PORT_" + mport + "_TCP_PROTO": "tcp",
		"KUBERNETES_PORT_" + mport + "_TCP_PORT":  mport,
		"KUBERNETES_PORT_" + mport + "_TCP_ADDR":  mip,
	}
	fooWant := map[string]string{
		"FOO_SVC_SERVICE_HOST":        ip,
		"FOO_SVC_SERVICE_PORT":        "8080",
		"FOO_SVC_SERVICE_PORT_HTTP":   "8080",
		"FOO_SVC_SERVICE_PORT_DNS":    "53",
		"FOO_SVC_PORT":                "mine", // the container's own wins over tcp://ip:8080
		"FOO_SVC_PORT_8080_TCP":       "tcp://" + ip + ":8080",
		"FOO_SVC_PORT_8080_TCP_PROTO": "tcp",
		"FOO_SVC_PORT_8080_TCP_PORT":  "8080",
		"FOO_SVC_PORT_8080_TCP_ADDR":  ip,
		"FOO_SVC_PORT_53_UDP":         "udp://" + ip + ":53",
		"FOO_SVC_PORT_53_UDP_PROTO":   "udp",
		"FOO_SVC_PORT_53_UDP_PORT":    "53",
		"FOO_SVC_PORT_53_UDP_ADDR":    ip,
		"FOO_URL":                     "http://" + ip + ":8080",
	}
	check := func(pod string, env, want map[string]string) {
		t.Helper()
		for k, v := range want {
			if env[k] != v {
				t.Errorf("pod %s: %s=%q, want %q", pod, k, env[k], v)
			}
		}
	}

	env := envOf(withLinks)
	check(withLinks, env, masterWant)
	check(withLinks, env, fooWant)
	for k := range env {
		if strings.HasPrefix(k, "DB_") || strings.HasPrefix(k, "ELSEWHERE") {
			t.Errorf("pod %s has %s: a headless or another namespace's Service has no variables", withLinks, k)
		}
	}

	env = envOf(without)
	check(without, env, masterWant)
	check(without, env, map[string]string{"FOO_SVC_PORT": "mine", "FOO_URL": "http://$(FOO_SVC_SERVICE_HOST):$(FOO_SVC_SERVICE_PORT_HTTP)"})
	for k := range env {
		if strings.HasPrefix(k, "FOO_SVC_") && k != "FOO_SVC_PORT" {
			t.Errorf("pod %s with enableServiceLinks false has %s=%s", without, k, env[k])
		}
	}

	// A Service created later reaches the node with the pod and restarts nothing.
	// The container's id from the node itself: the API's copy of the status may lag behind the
	// logs read above (the CI run that found this had no container status in the API yet).
	var ctrID string
	within(t, runBound, "the node reports pod "+withLinks+"'s running container", func() (bool, string) {
		p, err := w.agentAPI.GetPod(ctx, ns, withLinks)
		if err != nil {
			return false, err.Error()
		}
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ContainerID == "" {
			return false, "no container status yet"
		}
		ctrID = p.Status.ContainerStatuses[0].ContainerID
		return true, ""
	})
	mkSvc(ns, "late", false, v1.ServicePort{Port: 9000})
	within(t, runBound, "the node's pod "+withLinks+" carries the late Service's variables", func() (bool, string) {
		p, err := w.agentAPI.GetPod(ctx, ns, withLinks)
		if err != nil {
			return false, err.Error()
		}
		a := p.Annotations[svcenv.Annotation]
		return strings.Contains(a, `"LATE_SERVICE_HOST"`), a
	})
	p, err := w.agentAPI.GetPod(ctx, ns, withLinks)
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.ContainerID != ctrID || cs.RestartCount != 0 {
			t.Errorf("a Service change restarted the container: %s restarts %d, was %s", cs.ContainerID, cs.RestartCount, ctrID)
		}
	}
	if _, ok := w.tasks(t)[containerdID(ctrID)]; !ok {
		t.Errorf("container %s no longer runs after a Service change", ctrID)
	}

	for _, name := range []string{withLinks, without} {
		if err := core.Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", name, err)
		}
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
