package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

const configDir = "../../configs/bridge"

// object is one decoded manifest.
type object struct {
	file string
	kind string
	obj  any
}

// loadConfigs decodes every YAML document under configs/bridge strictly: an unknown or duplicate
// field (a typo) fails.
func loadConfigs(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(configDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML in %s: %v", configDir, err)
	}
	var out []object
	sepRE := regexp.MustCompile(`(?m)^---\s*$`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range sepRE.Split(string(b), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			var obj any
			switch meta.APIVersion + " " + meta.Kind {
			case "v1 Namespace":
				obj = &v1.Namespace{}
			case "v1 ServiceAccount":
				obj = &v1.ServiceAccount{}
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "rbac.authorization.k8s.io/v1 Role":
				obj = &rbacv1.Role{}
			case "rbac.authorization.k8s.io/v1 RoleBinding":
				obj = &rbacv1.RoleBinding{}
			case "apps/v1 Deployment":
				obj = &appsv1.Deployment{}
			default:
				t.Fatalf("%s document %d: unexpected %q %q (add it to this test)", f, i, meta.APIVersion, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s document %d (%s): %v", f, i, meta.Kind, err)
				continue
			}
			out = append(out, object{file: filepath.Base(f), kind: meta.Kind, obj: obj})
		}
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestStrictDecodeCatchesTypos(t *testing.T) {
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n"), &d); err == nil {
		t.Fatal("a misspelt field decoded: the strict decoding below proves nothing")
	}
}

func TestBridgeManifests(t *testing.T) {
	objs := loadConfigs(t)
	var dep *appsv1.Deployment
	var clusterRole *rbacv1.ClusterRole
	roles := map[string]*rbacv1.Role{}
	bound := map[string]bool{}
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *appsv1.Deployment:
			dep = x
		case *rbacv1.ClusterRole:
			clusterRole = x
		case *rbacv1.Role:
			roles[x.Namespace+"/"+x.Name] = x
		case *rbacv1.RoleBinding:
			bound[x.RoleRef.Kind+" "+x.Namespace+"/"+x.RoleRef.Name] = slices.ContainsFunc(x.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == "ServiceAccount" && s.Name == "mqlet-bridge" && s.Namespace == "mqlet-system"
			})
		case *rbacv1.ClusterRoleBinding:
			bound["ClusterRole "+x.RoleRef.Name] = slices.ContainsFunc(x.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == "ServiceAccount" && s.Name == "mqlet-bridge" && s.Namespace == "mqlet-system"
			})
		}
	}
	if dep == nil || clusterRole == nil {
		t.Fatal("configs/bridge lacks the Deployment or the ClusterRole")
	}

	// The Deployment: two replicas, probes on the bridge's endpoints, flags the binary accepts.
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Error("the Deployment must run two replicas")
	}
	spec := dep.Spec.Template.Spec
	if spec.ServiceAccountName != "mqlet-bridge" || len(spec.Containers) != 1 {
		t.Fatalf("pod spec: service account %q, %d containers", spec.ServiceAccountName, len(spec.Containers))
	}
	ctr := spec.Containers[0]
	if ctr.ReadinessProbe == nil || ctr.ReadinessProbe.HTTPGet == nil || ctr.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("readiness probe must GET /readyz")
	}
	if ctr.LivenessProbe == nil || ctr.LivenessProbe.HTTPGet == nil || ctr.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Error("liveness probe must GET /healthz")
	}
	_, _, err := parse(t, ctr.Args...)
	if err != nil && !strings.Contains(err.Error(), "no such file") && !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("the Deployment's args do not parse: %v", err)
	}
	// The TLS files do not exist here (type:"existingfile"); parse again without them to check the rest.
	var rest []string
	for _, a := range ctr.Args {
		if !strings.HasPrefix(a, "--mqtt-ca-file") && !strings.HasPrefix(a, "--mqtt-cert-file") && !strings.HasPrefix(a, "--mqtt-key-file") && !strings.HasPrefix(a, "--signing-key") {
			rest = append(rest, a)
		}
	}
	c, _, err := parse(t, rest...)
	if err != nil {
		t.Fatalf("the Deployment's args do not parse: %v", err)
	}
	// The bridge signs what it writes, with a key mounted from a Secret only its owner can read.
	signed := false
	for _, a := range ctr.Args {
		dir, ok := strings.CutPrefix(a, "--signing-key=")
		if !ok {
			continue
		}
		for _, m := range ctr.VolumeMounts {
			if strings.HasPrefix(dir, m.MountPath+"/") {
				for _, v := range spec.Volumes {
					if v.Name == m.Name && v.Secret != nil && v.Secret.DefaultMode != nil && *v.Secret.DefaultMode&0o077 == 0 {
						signed = true
					}
				}
			}
		}
	}
	if !signed {
		t.Error("the Deployment must pass --signing-key from a mounted Secret with a 0400-like defaultMode")
	}
	if err := c.Run.validate(); err != nil {
		t.Errorf("the Deployment's args: %v", err)
	}
	if !strings.HasSuffix(c.Run.MetricsAddr, ":10360") || strings.HasPrefix(c.Run.MetricsAddr, "127.") {
		t.Errorf("--metrics-addr %q: the kubelet's probes must reach it", c.Run.MetricsAddr)
	}
	mounted := false
	for _, m := range ctr.VolumeMounts {
		for _, a := range ctr.Args {
			if strings.HasPrefix(a, "--mqtt-ca-file="+m.MountPath+"/") {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Error("--mqtt-ca-file does not point into a mounted volume")
	}

	// RBAC: what the bridge's code calls.
	need := map[string][]string{
		"/nodes":               {"get", "list", "watch", "create", "patch", "update"},
		"/nodes/status":        {"patch", "update"},
		"/pods":                {"get", "list", "watch", "delete"},
		"/pods/status":         {"patch", "update"},
		"/configmaps":          {"get", "list", "watch"},
		"/secrets":             {"get", "list", "watch"},
		"events.k8s.io/events": {"create", "patch"},
	}
	for res, verbs := range need {
		group, resource, _ := strings.Cut(res, "/")
		for _, v := range verbs {
			if !allows(clusterRole.Rules, group, resource, v, "") {
				t.Errorf("ClusterRole does not allow %s on %s", v, res)
			}
		}
	}
	if allows(clusterRole.Rules, "coordination.k8s.io", "leases", "update", "") {
		t.Error("the ClusterRole grants leases cluster-wide: Leases belong in namespaced Roles")
	}
	nodeLeases := roles["kube-node-lease/mqlet-bridge-node-leases"]
	leader := roles["mqlet-system/mqlet-bridge-leader-election"]
	if nodeLeases == nil || leader == nil {
		t.Fatalf("missing Roles for node Leases or leader election: %v", roles)
	}
	for _, v := range []string{"get", "create", "update"} {
		if !allows(nodeLeases.Rules, "coordination.k8s.io", "leases", v, "edge-1") {
			t.Errorf("node Lease Role does not allow %s", v)
		}
		if !allows(leader.Rules, "coordination.k8s.io", "leases", v, "mqlet-bridge") {
			t.Errorf("leader Role does not allow %s on the mqlet-bridge Lease", v)
		}
	}
	for _, b := range []string{"ClusterRole mqlet-bridge", "Role kube-node-lease/mqlet-bridge-node-leases", "Role mqlet-system/mqlet-bridge-leader-election"} {
		if !bound[b] {
			t.Errorf("%s is not bound to the mqlet-bridge ServiceAccount", b)
		}
	}
}

// allows reports whether rules grant verb on group/resource (named name, "" for any).
func allows(rules []rbacv1.PolicyRule, group, resource, verb, name string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) &&
			(len(r.ResourceNames) == 0 || name != "" && slices.Contains(r.ResourceNames, name)) {
			if verb == "create" || len(r.ResourceNames) == 0 || name != "" {
				return true
			}
		}
	}
	return false
}
