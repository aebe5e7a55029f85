package kubetest

import (
	"context"
	"fmt"
	"os"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

var yamlSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// CreateManifests creates the objects of multi-document YAML files such as configs/bridge's
// namespace.yaml and rbac.yaml (Namespace, ServiceAccount and the four RBAC kinds, decoded
// strictly), so that the bridge runs in tests and the fleet bench with exactly the rights it is
// deployed with. Objects that already exist are left as they are; any other kind is an error.
func CreateManifests(ctx context.Context, cs kubernetes.Interface, paths ...string) error {
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range yamlSeparator.Split(string(raw), -1) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				return fmt.Errorf("%s document %d: %w", path, i, err)
			}
			var obj any
			switch meta.Kind {
			case "":
				continue
			case "Namespace":
				obj = &corev1.Namespace{}
			case "ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "Role":
				obj = &rbacv1.Role{}
			case "RoleBinding":
				obj = &rbacv1.RoleBinding{}
			default:
				return fmt.Errorf("%s document %d: unexpected kind %q", path, i, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				return fmt.Errorf("%s document %d (%s): %w", path, i, meta.Kind, err)
			}
			switch x := obj.(type) {
			case *corev1.Namespace:
				_, err = cs.CoreV1().Namespaces().Create(ctx, x, metav1.CreateOptions{})
			case *corev1.ServiceAccount:
				_, err = cs.CoreV1().ServiceAccounts(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
			case *rbacv1.ClusterRole:
				_, err = cs.RbacV1().ClusterRoles().Create(ctx, x, metav1.CreateOptions{})
			case *rbacv1.ClusterRoleBinding:
				_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, x, metav1.CreateOptions{})
			case *rbacv1.Role:
				_, err = cs.RbacV1().Roles(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
			case *rbacv1.RoleBinding:
				_, err = cs.RbacV1().RoleBindings(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create %s from %s: %w", meta.Kind, path, err)
			}
		}
	}
	return nil
}
