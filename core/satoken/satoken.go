// Package satoken is the contract between mqlet-bridge and a node for the Secrets that carry pods'
// service account tokens (docs/kubernetes.md, "Service account tokens"): the bridge makes one per
// serviceAccountToken projection of a pod and marks it with the pod's UID, and a node gives such
// a Secret to that pod only. So a pod that names another pod's token Secret (its name is
// predictable) gets nothing, and a user's own Secret can never pose as one.
package satoken

import (
	"strings"

	v1 "k8s.io/api/core/v1"
)

// NamePrefix starts the name of every token Secret: the pod's UID and the projection's place in
// the pod follow.
const NamePrefix = "mqlet-sa-token-"

// AnnotationPodUID on a token Secret names the one pod that may read it.
const AnnotationPodUID = "mqlet.io/service-account-token-pod-uid"

// Reserved says whether name is a token Secret's: the bridge never takes a Secret of that name
// from the API.
func Reserved(name string) bool { return strings.HasPrefix(name, NamePrefix) }

// ForOtherPod says whether s is a token Secret made for a pod other than uid.
func ForOtherPod(s *v1.Secret, uid string) bool {
	owner, ok := s.Annotations[AnnotationPodUID]
	return ok && owner != uid
}
