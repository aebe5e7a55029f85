package pods

import (
	"slices"

	"github.com/mqlet/mqlet/core/svcenv"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
)

// masterService is the Service whose variables every pod gets (kubelet's masterServices).
const masterService = "kubernetes"

// withServiceEnv puts the pod's service environment variables (enableServiceLinks) on sp, the pod
// as its node gets it, in svcenv.Annotation; the node adds them to each container's environment
// when it starts the container. They go as an annotation, not as env entries of the containers:
// a Service created or changed later then changes no container spec, so the node restarts
// nothing, and a container (re)started afterwards sees the values current then, as with kubelet.
// An annotation of that name the user wrote is replaced: only the bridge speaks for the API's
// Services.
func (c *Controller) withServiceEnv(sp, apiPod *v1.Pod) {
	delete(sp.Annotations, svcenv.Annotation)
	links := apiPod.Spec.EnableServiceLinks == nil || *apiPod.Spec.EnableServiceLinks // the API's default
	var svcs []*v1.Service
	if links {
		svcs, _ = c.svcLister.Services(apiPod.Namespace).List(labels.Everything()) // a cache: no error
	}
	if m, err := c.svcLister.Services(metav1.NamespaceDefault).Get(masterService); err == nil {
		svcs = append(svcs, m)
	}
	env := svcenv.ForPod(svcs, apiPod.Namespace, links)
	if len(env) == 0 {
		return
	}
	if sp.Annotations == nil {
		sp.Annotations = map[string]string{}
	}
	sp.Annotations[svcenv.Annotation] = svcenv.Encode(env)
}

// serviceChanged queues the nodes of the pods whose service variables a Service's change may
// change: those of its namespace, and every node's for the master service. A change that leaves
// its variables as they were (labels, selector, endpoints' churn) queues nothing.
func (c *Controller) serviceChanged(oldObj, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, ok := obj.(*v1.Service)
	if !ok {
		return
	}
	if old, ok := oldObj.(*v1.Service); ok && equality.Semantic.DeepEqual(svcenv.Vars(old), svcenv.Vars(s)) {
		return
	}
	var pods []any
	if s.Namespace == metav1.NamespaceDefault && s.Name == masterService {
		pods = c.pods.GetIndexer().List()
	} else {
		pods, _ = c.pods.GetIndexer().ByIndex(cache.NamespaceIndex, s.Namespace)
	}
	var nodes []string
	for _, o := range pods {
		if p := podOf(o); p != nil && p.Spec.NodeName != "" && c.o.Served(p.Spec.NodeName) {
			nodes = append(nodes, p.Spec.NodeName)
		}
	}
	slices.Sort(nodes)
	for _, n := range slices.Compact(nodes) {
		c.queueNode(n)
	}
}
