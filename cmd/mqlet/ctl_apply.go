package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// CtlApplyCmd is `mqlet ctl apply -f FILE --node NODE`.
type CtlApplyCmd struct {
	File string        `short:"f" required:"" help:"Manifest file (YAML, several documents allowed, or JSON), or - for stdin."`
	Node string        `required:"" help:"Node to apply to."`
	Wait time.Duration `default:"15s" help:"When the node is online, wait this long for it to apply or refuse every object (0: do not wait). Refusals make the command fail; objects the node has not taken in by then stay queued for it."`
}

// Run checks every document, applies them all at one generation, and waits for the node's
// verdict on them.
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
		fmt.Fprintf(env.out, "%s %s (generation %d)\n", objectRef(o.Kind, o.Namespace, o.Name), verb, o.Generation)
	}
	if c.Wait <= 0 {
		return nil
	}
	if err := waitApplied(ctx, cl, c.Node, res, c.Wait, env); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// objectRef is how ctl names an object: pod/default/web.
func objectRef(kind protocol.ObjectKind, namespace, name string) string {
	return strings.ToLower(string(kind)) + "/" + namespace + "/" + name
}

// keyRef is objectRef of a protocol.ObjectKey (the key itself when it cannot be parsed).
func keyRef(key string) string {
	kind, ns, name, err := protocol.ParseObjectKey(key)
	if err != nil {
		return key
	}
	return objectRef(kind, ns, name)
}

// waitApplied waits up to wait for node to report an outcome, in its retained acks, for every
// object of an apply at the generation the apply left it at: applied (with that generation and the
// digest of the payload the index lists) or refused. Only the node judges an object (its policy is
// its own), so this is where a refusal reaches the user: each is printed with the node's reason,
// and any makes the command fail. A node that is not online, or that has not answered in time,
// gets the objects later from the broker: that is said, and is no failure.
func waitApplied(ctx context.Context, cl *ctlclient.Client, node string, res *ctlclient.ApplyResult, wait time.Duration, env *ctlEnv) error {
	n, _, err := cl.Node(ctx, node)
	switch {
	case errors.Is(err, ctlclient.ErrNotFound):
		fmt.Fprintf(env.errOut, "node %s has not connected yet: the objects are queued for it on the broker\n", node)
		return nil
	case err != nil:
		return fmt.Errorf("the objects are written; reading whether node %s is online failed: %w", node, err)
	case n.State != ctlclient.StateOnline:
		fmt.Fprintf(env.errOut, "node %s is %s: the objects are queued for it on the broker\n", node, n.State)
		return nil
	}
	// The digest of each object's payload is in the index the apply wrote (or left as it was). An
	// object the index no longer lists at the apply's generation was changed or deleted by another
	// writer since: its outcome is that writer's to see.
	idx, err := cl.Index(ctx, node)
	if err != nil {
		return fmt.Errorf("the objects are written; reading node %s's index back failed: %w", node, err)
	}
	want := map[string]protocol.IndexEntry{}
	var order []string
	for _, o := range res.Objects {
		key := o.Key()
		e, ok := idx.Objects[key]
		if !ok || e.Generation != o.Generation {
			fmt.Fprintf(env.errOut, "%s was changed by another writer since this apply: not waiting for it\n", objectRef(o.Kind, o.Namespace, o.Name))
			continue
		}
		want[key] = e
		order = append(order, key)
	}
	if len(order) == 0 {
		return nil
	}
	written := false
	for _, o := range res.Objects {
		written = written || !o.Unchanged
	}
	var outcome map[string]applyOutcome
	var indexRefused *protocol.Refusal
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	_, err = cl.WatchAcks(wctx, node, func(a *protocol.Acks) bool {
		outcome = outcomes(a, want, idx)
		// The node refused the index this apply wrote (another writer's index of the same
		// revision, say): none of its objects will be taken in from it.
		// A refusal of that revision while the node took another index of it (or a newer one) is
		// about the other writer's index: then the entries below tell.
		if written && a.IndexRefused != nil && a.IndexRefused.Generation == res.Generation && a.IndexRevision < res.Generation {
			indexRefused = a.IndexRefused
			return true
		}
		for _, key := range order {
			if outcome[key].state == outcomePending {
				return false
			}
		}
		return true
	})
	if err != nil && ctx.Err() != nil {
		return err // interrupted
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the objects are written; waiting for node %s's acks failed: %w", node, err)
	}
	if indexRefused != nil {
		return fmt.Errorf("node %s refused the index of revision %d that lists these objects: %s", node, indexRefused.Generation, indexRefused.Reason)
	}
	var refused, pending []string
	applied := 0
	for _, key := range order {
		switch o := outcome[key]; o.state {
		case outcomeApplied:
			applied++
		case outcomeSuperseded:
			fmt.Fprintf(env.errOut, "%s was changed or deleted by another writer before node %s took it in\n", keyRef(key), node)
		case outcomeNewerIndex:
			fmt.Fprintf(env.errOut, "node %s runs a newer index than this apply wrote (another writer's): `mqlet ctl describe node %s` shows what it made of %s\n", node, node, keyRef(key))
		case outcomeRefused:
			refused = append(refused, keyRef(key))
			fmt.Fprintf(env.errOut, "%s refused by node %s (generation %d): %s\n", keyRef(key), node, o.refusal.Generation, o.refusal.Reason)
		case outcomePending:
			pending = append(pending, keyRef(key))
		}
	}
	if len(pending) > 0 {
		fmt.Fprintf(env.errOut, "node %s has not reported on %s within %s: queued for it on the broker (`mqlet ctl describe node %s` shows what it made of them)\n",
			node, strings.Join(pending, ", "), wait, node)
	}
	if len(refused) > 0 {
		return fmt.Errorf("node %s refused %d of %d objects: %s", node, len(refused), len(res.Objects), strings.Join(refused, ", "))
	}
	if applied > 0 {
		fmt.Fprintf(env.out, "node %s applied %d of %d objects\n", node, applied, len(res.Objects))
	}
	return nil
}

// The outcome of one object of an apply, as the node's acks tell it.
type applyOutcome struct {
	state   int
	refusal protocol.Refusal
}

const (
	outcomePending    = iota // no outcome at this generation yet (missing, or an older index)
	outcomeApplied           // applied at this generation, with this digest
	outcomeRefused           // refused at this generation
	outcomeSuperseded        // the node is past this generation: another writer changed or deleted the object
	outcomeNewerIndex        // the node runs a newer index (another writer's) that this client has not read
)

// outcomes reads the node's acks for each wanted key; idx is the index the apply wrote (or left
// in force), read back from the broker. Compact acks tell what was applied only against the index
// they name: for a newer one, written by another writer since, the outcome is that writer's to see.
func outcomes(a *protocol.Acks, want map[string]protocol.IndexEntry, idx *protocol.Index) map[string]applyOutcome {
	out := make(map[string]applyOutcome, len(want))
	revision := idx.Revision
	appliedSet, known := a.AppliedIn(idx)
	for key, e := range want {
		applied, isApplied := appliedSet[key]
		refused, isRefused := a.Refused[key]
		missing, isMissing := a.Missing[key]
		switch {
		case isApplied && applied.Generation == e.Generation && applied.Digest == e.Digest:
			out[key] = applyOutcome{state: outcomeApplied}
		case isRefused && refused.Generation == e.Generation && (refused.Digest == "" || refused.Digest == e.Digest):
			out[key] = applyOutcome{state: outcomeRefused, refusal: refused}
		case isApplied && applied.Generation > e.Generation, isRefused && refused.Generation > e.Generation,
			isMissing && missing.Generation > e.Generation:
			out[key] = applyOutcome{state: outcomeSuperseded}
		case !isApplied && !isRefused && !isMissing && a.IndexRevision > revision && !known:
			// Compact acks of a newer index, which this client has not read: whether it still
			// lists the object is that index's writer's to tell.
			out[key] = applyOutcome{state: outcomeNewerIndex}
		case !isApplied && !isRefused && !isMissing && a.IndexRevision > revision:
			// A newer index leaves the object out: deleted since.
			out[key] = applyOutcome{state: outcomeSuperseded}
		default:
			out[key] = applyOutcome{state: outcomePending}
		}
	}
	return out
}

// ctlObjects decodes and checks every document of a file: Pods, ConfigMaps and Secrets. It checks
// only what holds for any node (strict decoding, kinds, names, duplicate keys): whether a pod is
// admitted is the node's decision under its own policy (one node may allow host networking or a
// hostPath that another refuses), reported back in its acks (see waitApplied). Every problem is
// reported, by document number and line, and then nothing is applied.
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
		// A name, not a judgement: the pod would be sent to one node while naming another.
		if o.Spec.NodeName != "" && o.Spec.NodeName != node {
			return nil, "", fmt.Errorf("%s: spec.nodeName is %q, but it is being applied to node %q", ref, o.Spec.NodeName, node)
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

// Run publishes the index without the object, then clears the object's retained topic.
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
