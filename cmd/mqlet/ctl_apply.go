package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/source"
	"github.com/mqlet/mqlet/agent/sysctl"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// CtlApplyCmd is `mqlet ctl apply -f FILE --node NODE`.
type CtlApplyCmd struct {
	File string `short:"f" required:"" help:"Manifest file (YAML, several documents allowed, or JSON), or - for stdin."`
	Node string `required:"" help:"Node to apply to."`
}

// Run checks every document, then applies them all at one generation.
func (c *CtlApplyCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	what := "ctl apply " + c.File
	var data []byte
	var err error
	if c.File == "-" {
		data, err = io.ReadAll(env.in)
	} else {
		data, err = os.ReadFile(c.File)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := protocol.ValidateNodeName(c.Node); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	objs, err := ctlObjects(c.File, data, c.Node)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer cl.Close()
	res, err := cl.Apply(ctx, c.Node, objs)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(env.errOut, "Warning: %s\n", w)
	}
	for _, o := range res.Objects {
		verb := "configured"
		switch {
		case o.Unchanged:
			verb = "unchanged"
		case o.Created:
			verb = "created"
		}
		fmt.Fprintf(env.out, "%s/%s/%s %s (generation %d)\n", strings.ToLower(string(o.Kind)), o.Namespace, o.Name, verb, o.Generation)
	}
	return nil
}

// ctlObjects decodes and checks every document of a file: Pods (admitted as the node would, so a
// bad pod is refused before it is sent), ConfigMaps and Secrets. Every problem is reported, by
// document number and line, and then nothing is applied.
func ctlObjects(file string, data []byte, node string) ([]any, error) {
	docs := manifest.Documents(file, data)
	if len(docs) == 0 {
		return nil, errors.New("no objects in the file")
	}
	var objs []any
	var problems []string
	seen := map[string]int{} // object key -> document that declared it
	for _, d := range docs {
		obj, key, err := ctlObject(d, node)
		if err == nil {
			if first, dup := seen[key]; dup {
				err = fmt.Errorf("%s is already declared in document %d", key, first)
			} else {
				seen[key] = d.Index
			}
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("document %d (line %d): %v", d.Index, d.Line, err))
			continue
		}
		objs = append(objs, obj)
	}
	switch len(problems) {
	case 0:
		return objs, nil
	case 1:
		return nil, errors.New(problems[0])
	}
	return nil, fmt.Errorf("%d documents refused, nothing applied:\n  %s", len(problems), strings.Join(problems, "\n  "))
}

// ctlObject decodes one document strictly into the object to send and its protocol.ObjectKey.
func ctlObject(d manifest.Document, node string) (any, string, error) {
	apiVersion, kind, err := d.TypeMeta()
	if err != nil {
		return nil, "", err
	}
	switch kind {
	case "Pod", "ConfigMap", "Secret":
	case "":
		return nil, "", errors.New("kind is required (Pod, ConfigMap or Secret)")
	default:
		return nil, "", fmt.Errorf("kind %s is not supported (want Pod, ConfigMap or Secret)", kind)
	}
	if apiVersion != "v1" {
		return nil, "", fmt.Errorf("apiVersion %q is not supported for kind %s (want v1)", apiVersion, kind)
	}
	var obj any
	var meta *metav1.ObjectMeta
	switch kind {
	case "Pod":
		p := &v1.Pod{}
		obj, meta = p, &p.ObjectMeta
	case "ConfigMap":
		cm := &v1.ConfigMap{}
		obj, meta = cm, &cm.ObjectMeta
	case "Secret":
		s := &v1.Secret{}
		obj, meta = s, &s.ObjectMeta
	}
	if err := d.DecodeStrict(obj); err != nil {
		return nil, "", err
	}
	if meta.Namespace == "" {
		meta.Namespace = "default"
	}
	k := protocol.ObjectKind(kind)
	if err := protocol.ValidateObjectName(k, meta.Namespace, meta.Name); err != nil {
		return nil, "", err
	}
	ref := fmt.Sprintf("%s %s/%s", strings.ToLower(kind), meta.Namespace, meta.Name)
	switch o := obj.(type) {
	case *v1.Pod:
		if o.Spec.NodeName != "" && o.Spec.NodeName != node {
			return nil, "", fmt.Errorf("%s: spec.nodeName is %q, but it is being applied to node %q", ref, o.Spec.NodeName, node)
		}
		// The node admits the pod again, under its own policy; this catches what any node would
		// refuse while the user is still at the keyboard.
		// Every namespaced sysctl passes here: which unsafe ones the node allows is its own setting.
		if _, err := (admission.Admitter{NodeName: node, Sysctls: sysctl.Namespaced()}).Admit(source.Item{Pod: o, Ref: source.Ref{Kind: source.MQTT}}); err != nil {
			return nil, "", fmt.Errorf("%s: %w", ref, err)
		}
		// A pasted `kubectl get -o yaml` carries a status; what is sent is desired state only.
		o.Status = v1.PodStatus{}
	case *v1.ConfigMap:
		if err := checkKeys(o.Data, o.BinaryData); err != nil {
			return nil, "", fmt.Errorf("%s: %w", ref, err)
		}
	case *v1.Secret:
		// The API server folds stringData into data on write; ctl is the API server here, so the
		// node only ever sees data.
		if len(o.StringData) > 0 {
			if o.Data == nil {
				o.Data = map[string][]byte{}
			}
			for k, v := range o.StringData {
				o.Data[k] = []byte(v)
			}
			o.StringData = nil
		}
		if err := checkKeys[[]byte, []byte](o.Data, nil); err != nil {
			return nil, "", fmt.Errorf("%s: %w", ref, err)
		}
	}
	return obj, protocol.ObjectKey(k, meta.Namespace, meta.Name), nil
}

// checkKeys validates the keys of a ConfigMap's data and binaryData (or a Secret's data): they
// become file names in volumes.
func checkKeys[A, B any](data map[string]A, binary map[string]B) error {
	var problems []string
	for k := range data {
		if errs := validation.IsConfigMapKey(k); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("key %q: %s", k, strings.Join(errs, "; ")))
		}
	}
	for k := range binary {
		if errs := validation.IsConfigMapKey(k); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("key %q: %s", k, strings.Join(errs, "; ")))
		}
		if _, dup := data[k]; dup {
			problems = append(problems, fmt.Sprintf("key %q is in both data and binaryData", k))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// CtlDeleteCmd is `mqlet ctl delete pod|configmap|secret NAME --node NODE`.
type CtlDeleteCmd struct {
	Kind      string `arg:"" enum:"pod,pods,configmap,configmaps,cm,secret,secrets" help:"pod, configmap or secret."`
	Name      string `arg:"" help:"Name (or NAMESPACE/NAME)."`
	Node      string `required:"" help:"Node to delete it from."`
	Namespace string `short:"n" default:"default" help:"Namespace."`
}

// Run publishes the tombstone and the index without the object.
func (c *CtlDeleteCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	kind := map[string]protocol.ObjectKind{"pod": protocol.KindPod, "pods": protocol.KindPod,
		"configmap": protocol.KindConfigMap, "configmaps": protocol.KindConfigMap, "cm": protocol.KindConfigMap,
		"secret": protocol.KindSecret, "secrets": protocol.KindSecret}[c.Kind]
	ns, name, err := splitPodRef(c.Namespace, c.Name)
	if err != nil {
		return fmt.Errorf("ctl delete: %w", err)
	}
	ref := fmt.Sprintf("%s/%s/%s", strings.ToLower(string(kind)), ns, name)
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("ctl delete %s: %w", ref, err)
	}
	defer cl.Close()
	gen, err := cl.Delete(ctx, c.Node, kind, ns, name)
	if err != nil {
		if errors.Is(err, ctlclient.ErrNotFound) {
			return fmt.Errorf("ctl delete: %s not found on node %s", ref, c.Node)
		}
		return fmt.Errorf("ctl delete %s: %w", ref, err)
	}
	fmt.Fprintf(env.out, "%s deleted (generation %d)\n", ref, gen)
	return nil
}
