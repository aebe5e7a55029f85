package kubetest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/kubetest"
	authnv1 "k8s.io/api/authentication/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

// TestCluster runs the whole control plane and checks each component does its part: the
// apiserver stores a pod bound to a node, the scheduler places a pod by nodeSelector on the Ready
// node that matches, the node lifecycle controller (with kubetest's fast timing) marks a node
// whose Lease stops being renewed Unknown while a node still renewed stays Ready, RBAC confines a
// limited user, the components survive discarded goroutine threads, and Stop leaves no process
// behind.
func TestCluster(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	started := c.PIDs()
	discardThreads(5, 200)
	time.Sleep(time.Second) // a discarded thread exits after its goroutine; let any signal land
	for name, pid := range started {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(b), ") Z ") {
			t.Errorf("%s (pid %d) died when goroutine threads were discarded", name, pid)
		}
	}

	// The admin kubeconfig file works on its own too (what a bridge started with --kubeconfig sees).
	fromFile, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		t.Fatalf("load %s: %v", c.Kubeconfig(), err)
	}
	if _, err := kubernetes.NewForConfigOrDie(fromFile).CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("admin kubeconfig file: get namespace kube-system: %v", err)
	}

	// Two Ready nodes, both renewing their Leases; only edge-a carries the edge label.
	renew, stopRenew := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopRenew(); wg.Wait() }()
	stopEdgeA := make(chan struct{})
	for _, n := range []struct {
		name  string
		edge  bool
		until <-chan struct{}
	}{{"edge-a", true, stopEdgeA}, {"plain-b", false, nil}} {
		registerReadyNode(t, ctx, cs, n.name, n.edge)
		wg.Add(1)
		go func() {
			defer wg.Done()
			renewLease(renew, t, cs, n.name, n.until)
		}()
	}

	// A pod bound by spec.nodeName is stored as given.
	bound := testPod("bound", map[string]string{})
	bound.Spec.NodeName = "plain-b"
	if _, err := cs.CoreV1().Pods("default").Create(ctx, bound, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod bound to plain-b: %v", err)
	}
	if got, err := cs.CoreV1().Pods("default").Get(ctx, "bound", metav1.GetOptions{}); err != nil || got.Spec.NodeName != "plain-b" {
		t.Fatalf("pod bound: nodeName %q, err %v; want plain-b", got.Spec.NodeName, err)
	}

	// The scheduler places a pod with a nodeSelector on the matching Ready node. The nodes were
	// created with the not-ready taint (admission); the lifecycle controller lifts it once they
	// report Ready, so this also shows the controller-manager at work.
	sel := testPod("selected", map[string]string{"node-role.kubernetes.io/edge": ""})
	if _, err := cs.CoreV1().Pods("default").Create(ctx, sel, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod with nodeSelector: %v", err)
	}
	var scheduledTo string
	waitUntil(t, 60*time.Second, "pod selected is scheduled", func() (bool, string) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "selected", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		scheduledTo = p.Spec.NodeName
		return scheduledTo != "", fmt.Sprintf("conditions %+v", p.Status.Conditions)
	})
	if scheduledTo != "edge-a" {
		t.Fatalf("pod selected scheduled to %q, want edge-a (the only node with the edge label)", scheduledTo)
	}

	// edge-a's Lease stops being renewed: the lifecycle controller marks it Unknown after its
	// grace period (20s here) and a monitor period. The wait ends before Kubernetes' default
	// grace period (50s) would, so it passes only when the fast timing is in effect. plain-b
	// keeps renewing and stays Ready.
	close(stopEdgeA)
	stopped := time.Now()
	waitUntil(t, 45*time.Second, "edge-a turns Unknown", func() (bool, string) {
		st, why := readyStatus(ctx, cs, "edge-a")
		return st == corev1.ConditionUnknown, why
	})
	t.Logf("edge-a turned Unknown %s after its Lease stopped being renewed", time.Since(stopped).Round(time.Second))
	if st, why := readyStatus(ctx, cs, "plain-b"); st != corev1.ConditionTrue {
		t.Fatalf("plain-b, still renewing its Lease, has Ready=%s (%s); want True", st, why)
	}

	checkLimitedUser(t, ctx, c, cs)
	checkServiceAccount(t, ctx, c)

	// Stop ends every component by pid; nothing may be left running.
	pids := c.PIDs()
	if len(pids) != 4 {
		t.Fatalf("PIDs() = %v; want the four components", pids)
	}
	stopRenew()
	wg.Wait()
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for name, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("%s (pid %d) still exists after Stop", name, pid)
		}
	}
}

// checkLimitedUser shows a UserKubeconfig identity has only what RBAC grants: no pods at first,
// then read access in one namespace through a RoleBinding to the built-in view ClusterRole.
func checkLimitedUser(t *testing.T, ctx context.Context, c *kubetest.Cluster, admin kubernetes.Interface) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.UserKubeconfig("alice", "edge-operators"))
	if err != nil {
		t.Fatalf("load alice's kubeconfig: %v", err)
	}
	alice := kubernetes.NewForConfigOrDie(cfg)
	who, err := alice.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("alice: self subject review: %v", err)
	}
	if u := who.Status.UserInfo; u.Username != "alice" || !slices.Contains(u.Groups, "edge-operators") {
		t.Fatalf("alice authenticates as %q in groups %v; want alice in edge-operators", u.Username, u.Groups)
	}
	if _, err := alice.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists pods without any binding: err %v; want Forbidden", err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "edge-operators-view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "edge-operators"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
	}
	if _, err := admin.RbacV1().RoleBindings("default").Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create rolebinding: %v", err)
	}
	// The RBAC authorizer reads bindings from an informer: the grant applies shortly after.
	waitUntil(t, 30*time.Second, "alice may list pods in default", func() (bool, string) {
		_, err := alice.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if _, err := alice.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists pods in kube-system (bound only in default): err %v; want Forbidden", err)
	}
}

func checkServiceAccount(t *testing.T, ctx context.Context, c *kubetest.Cluster) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.ServiceAccountKubeconfig("mqlet-system", "mqlet-bridge"))
	if err != nil {
		t.Fatalf("load the service account's kubeconfig: %v", err)
	}
	who, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("service account: self subject review: %v", err)
	}
	if want := "system:serviceaccount:mqlet-system:mqlet-bridge"; who.Status.UserInfo.Username != want {
		t.Fatalf("service account authenticates as %q; want %q", who.Status.UserInfo.Username, want)
	}
}

func registerReadyNode(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, edge bool) {
	t.Helper()
	labels := map[string]string{"kubernetes.io/hostname": name}
	if edge {
		labels["node-role.kubernetes.io/edge"] = ""
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("4Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	// The node lifecycle controller writes the new node too (taints, its own status): a
	// conflict means read again and retry.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Capacity, n.Status.Allocatable = res, res
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("post Ready status of node %s: %v", name, err)
	}
}

// renewLease keeps the node's Lease in kube-node-lease fresh every second (as a kubelet does
// every 10s with a 40s lease; the grace period here is 20s) until ctx ends or until is closed.
func renewLease(ctx context.Context, t *testing.T, cs kubernetes.Interface, node string, until <-chan struct{}) {
	leases := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	dur := int32(20)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l = &coordv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: node},
				Spec:       coordv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &dur, RenewTime: &now},
			}
			_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		case err == nil:
			l.Spec.RenewTime = &now
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			t.Logf("renew lease of %s: %v", node, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-until:
			return
		case <-tick.C:
		}
	}
}

func readyStatus(ctx context.Context, cs kubernetes.Interface, node string) (corev1.ConditionStatus, string) {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", err.Error()
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status, c.Reason + ": " + c.Message
		}
	}
	return "", "no Ready condition"
}

func testPod(name string, selector map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{
			NodeSelector: selector,
			Containers:   []corev1.Container{{Name: "c", Image: "mqlet.test/busybox:1"}},
		},
	}
}

// waitUntil polls cond every 200ms until it holds, failing the test with cond's last
// explanation when it has not after limit.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s (last: %s)", what, limit, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestStartFailureReportsLog: a component that cannot start makes StartCluster fail at once with
// the component's own complaint, and stops what had already started (etcd here).
func TestStartFailureReportsLog(t *testing.T) {
	kubetest.Require(t, kubetest.Options{})
	dir := t.TempDir()
	var started []string
	_, err := kubetest.StartCluster(context.Background(), kubetest.Options{
		Dir:            dir,
		EtcdOnDisk:     true, // every component's command line names dir: see the scan below
		APIServerFlags: []string{"--no-such-flag=1"},
		Logf: func(format string, args ...any) {
			if s := fmt.Sprintf(format, args...); strings.HasPrefix(s, "kubetest: starting ") {
				started = append(started, strings.TrimPrefix(s, "kubetest: starting "))
			}
		},
	})
	if err == nil {
		t.Fatal("StartCluster with an unknown kube-apiserver flag succeeded")
	}
	for _, want := range []string{"kube-apiserver exited", "unknown flag: --no-such-flag"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
	if !slices.Equal(started, []string{kubetest.Etcd, kubetest.APIServer}) {
		t.Fatalf("started %v; want etcd, then kube-apiserver", started)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), dir) {
			t.Errorf("a process is left running after the failed start: %s: %s", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// discardThreads ends n goroutines while they are locked to their OS threads, which makes the Go
// runtime discard those threads (the agent's namespace code does this on purpose). A child
// forked by such a thread dies with it (Pdeathsig); kubetest forks from a thread of its own, so
// the control plane must outlive this.
func discardThreads(rounds, n int) {
	for range rounds {
		discardRound(n)
		time.Sleep(100 * time.Millisecond) // the threads left idle meanwhile are the next round's
	}
}

func discardRound(n int) {
	// One at a time from here (a new goroutine often runs on this goroutine's thread), then
	// many at once (they spread over the idle threads).
	for range n {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(done) // ends locked: the thread exits with the goroutine
		}()
		<-done
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			time.Sleep(time.Millisecond)
		}()
	}
	wg.Wait()
}
