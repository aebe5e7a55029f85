package pods

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tokenVolumePrefix names the projected volume the ServiceAccount admission plugin injects
// (kube-api-access-<random>), holding an API token, the cluster's CA and the namespace.
const tokenVolumePrefix = "kube-api-access-"

// SanitizePod returns the pod as it is sent to a node: the API's object minus what the node
// cannot or must not take. The input is not modified.
//
//   - metadata.managedFields, resourceVersion and the deletion fields: bookkeeping of the API
//     server. resourceVersion changes with every status write, so keeping it would make each
//     status write look like a new desired pod and republish it.
//   - the injected kube-api-access-* volume and its mounts, when the bridge does not hand out
//     service account tokens (--no-service-account-tokens: a token on a device is a credential
//     outside the cluster, which an operator may not want). A projected serviceAccountToken
//     volume the user wrote is kept, so the node refuses the pod with a message naming the
//     field instead of running it without. When the bridge does hand them out, the volume stays
//     and Controller.withTokens fills it.
//   - spec.serviceAccount (the deprecated alias the API copies from serviceAccountName): the node
//     warns about it on every pod, and it has no effect there.
//   - enableServiceLinks (the API defaults it to true): the bridge has applied it already, as the
//     service variables it sends with the pod (Controller.withServiceEnv); an agent of an earlier
//     version would warn about it on every pod.
//   - status: desired state only; the node reports its own.
//
// metadata.uid and metadata.generation stay: the node keeps the uid (its status is matched to the
// API pod by it) and reports the generation it runs back as status.observedGeneration.
func SanitizePod(in *v1.Pod) *v1.Pod { return sanitizePod(in, false) }

// sanitizePod is SanitizePod; with keepTokens the kube-api-access-* volume stays, for the bridge
// to fill with a token of its own asking (Controller.withTokens).
func sanitizePod(in *v1.Pod, keepTokens bool) *v1.Pod {
	p := in.DeepCopy()
	p.TypeMeta = metav1.TypeMeta{}
	stripMeta(&p.ObjectMeta)
	p.Status = v1.PodStatus{}
	p.Spec.DeprecatedServiceAccount = ""
	p.Spec.EnableServiceLinks = nil

	drop := map[string]bool{}
	vols := p.Spec.Volumes[:0]
	for _, v := range p.Spec.Volumes {
		if !keepTokens && isInjectedTokenVolume(&v) {
			drop[v.Name] = true
			continue
		}
		vols = append(vols, v)
	}
	if len(vols) == 0 {
		vols = nil
	}
	p.Spec.Volumes = vols
	if len(drop) > 0 {
		for i := range p.Spec.InitContainers {
			dropMounts(&p.Spec.InitContainers[i], drop)
		}
		for i := range p.Spec.Containers {
			dropMounts(&p.Spec.Containers[i], drop)
		}
		for i := range p.Spec.EphemeralContainers { // the same fields as a container's
			dropMounts((*v1.Container)(&p.Spec.EphemeralContainers[i].EphemeralContainerCommon), drop)
		}
	}
	return p
}

// HasNodeSelection says whether the pod has a nodeSelector or required node affinity.
func HasNodeSelection(p *v1.Pod) bool {
	a := p.Spec.Affinity
	return len(p.Spec.NodeSelector) > 0 ||
		a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil
}

// DropNodeSelection removes the pod's nodeSelector and required node affinity (the preferred
// terms, which the node only warns about, stay).
func DropNodeSelection(p *v1.Pod) {
	p.Spec.NodeSelector = nil
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil {
		return
	}
	a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
	if len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		a.NodeAffinity = nil
	}
	if a.NodeAffinity == nil && a.PodAffinity == nil && a.PodAntiAffinity == nil {
		p.Spec.Affinity = nil
	}
}

// hasInjectedTokenVolume says whether p has the ServiceAccount admission plugin's volume.
func hasInjectedTokenVolume(p *v1.Pod) bool {
	for i := range p.Spec.Volumes {
		if isInjectedTokenVolume(&p.Spec.Volumes[i]) {
			return true
		}
	}
	return false
}

// isInjectedTokenVolume: the ServiceAccount admission plugin's volume, recognised by both its
// name and its token source, so that a user's own volume of that name is left alone.
func isInjectedTokenVolume(v *v1.Volume) bool {
	if !strings.HasPrefix(v.Name, tokenVolumePrefix) || v.Projected == nil {
		return false
	}
	for _, s := range v.Projected.Sources {
		if s.ServiceAccountToken != nil {
			return true
		}
	}
	return false
}

// WithDeletion copies the API's deletion of a pod being deleted (its deletionTimestamp and
// deletionGracePeriodSeconds) onto sp, the pod as its node gets it: the node stops the pod with
// that grace period (docs/protocol.md section 4.3). A pod not being deleted is left as it is.
func WithDeletion(sp, apiPod *v1.Pod) {
	if apiPod.DeletionTimestamp == nil {
		return
	}
	sp.DeletionTimestamp = apiPod.DeletionTimestamp.DeepCopy()
	if g := apiPod.DeletionGracePeriodSeconds; g != nil {
		v := *g
		sp.DeletionGracePeriodSeconds = &v
	}
}

func dropMounts(c *v1.Container, drop map[string]bool) {
	ms := c.VolumeMounts[:0]
	for _, m := range c.VolumeMounts {
		if !drop[m.Name] {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		ms = nil
	}
	c.VolumeMounts = ms
}

// SanitizeConfigMap returns the configMap as it is sent to a node.
func SanitizeConfigMap(in *v1.ConfigMap) *v1.ConfigMap {
	c := in.DeepCopy()
	c.TypeMeta = metav1.TypeMeta{}
	stripMeta(&c.ObjectMeta)
	return c
}

// SanitizeSecret returns the secret as it is sent to a node.
func SanitizeSecret(in *v1.Secret) *v1.Secret {
	s := in.DeepCopy()
	s.TypeMeta = metav1.TypeMeta{}
	stripMeta(&s.ObjectMeta)
	return s
}

func stripMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	m.ResourceVersion = ""
	m.DeletionTimestamp = nil
	m.DeletionGracePeriodSeconds = nil
	//lint:ignore SA1019 deprecated, but an old API server still fills it and the node would keep it
	m.SelfLink = ""
}
