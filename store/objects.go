package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/mqlet/mqlet/core/source"
	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
)

// ObjectKind is the kind of a stored object that pods use: a ConfigMap or a Secret.
type ObjectKind string

const (
	KindConfigMap ObjectKind = "ConfigMap"
	KindSecret    ObjectKind = "Secret"
)

// ObjectRecord is a ConfigMap or Secret delivered by a source, kept for pods to use later. It is
// keyed by Kind, Namespace and Name; exactly the field of its kind is set.
type ObjectRecord struct {
	Kind      ObjectKind
	Namespace string
	Name      string
	// Generation is the source's generation of the object (0 when it has none); the store keeps
	// it and does not compare it.
	Generation int64
	Source     source.Ref
	ConfigMap  *v1.ConfigMap // when Kind == KindConfigMap
	Secret     *v1.Secret    // when Kind == KindSecret
}

// objectRecord is the JSON of an objects value (sealed as a whole for a Secret). Kind, namespace
// and name are the key's, so they are not repeated.
type objectRecord struct {
	Source     sourceRecord  `json:"source"`
	Generation int64         `json:"generation"`
	ConfigMap  *v1.ConfigMap `json:"configMap,omitempty"`
	Secret     *v1.Secret    `json:"secret,omitempty"`
}

// errNoKey is why a DB opened without a node key refuses Secrets.
var errNoKey = errors.New("no node key configured (open the state db with OpenWith and Options.SecretKey from seal.LoadOrCreateKey): " +
	"secrets are never written in clear")

// objectKey is the key of an object in the objects bucket: "<kind>/<namespace>/<name>". Neither
// a namespace nor a name can hold '/', so the key splits back unambiguously.
func objectKey(kind ObjectKind, namespace, name string) (string, error) {
	if kind != KindConfigMap && kind != KindSecret {
		return "", fmt.Errorf("object %s/%s: kind %q is neither %s nor %s", namespace, name, kind, KindConfigMap, KindSecret)
	}
	for _, f := range [...]struct{ what, v string }{{"namespace", namespace}, {"name", name}} {
		if f.v == "" || strings.Contains(f.v, "/") {
			return "", fmt.Errorf("%s %s/%s: %s %q is empty or holds '/'", kind, namespace, name, f.what, f.v)
		}
	}
	return string(kind) + "/" + namespace + "/" + name, nil
}

func splitObjectKey(key string) (kind ObjectKind, namespace, name string, ok bool) {
	k, rest, ok1 := strings.Cut(key, "/")
	ns, n, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 || ns == "" || n == "" || strings.Contains(n, "/") || (ObjectKind(k) != KindConfigMap && ObjectKind(k) != KindSecret) {
		return "", "", "", false
	}
	return ObjectKind(k), ns, n, true
}

// sealData is the additional data a Secret is sealed with: its place in the file.
func sealData(key string) []byte {
	return []byte(string(bucketObjects) + "/" + key)
}

// encodeObject checks r and returns its key and its value in clear; every implementation of State
// refuses the same input.
func encodeObject(r ObjectRecord) (key string, val []byte, err error) {
	key, err = objectKey(r.Kind, r.Namespace, r.Name)
	if err != nil {
		return "", nil, err
	}
	var meta objectMeta
	switch r.Kind {
	case KindConfigMap:
		if r.ConfigMap == nil || r.Secret != nil {
			return "", nil, fmt.Errorf("%s: a %s record needs ConfigMap set and Secret nil", key, r.Kind)
		}
		meta = objectMeta{r.ConfigMap.Namespace, r.ConfigMap.Name}
	case KindSecret:
		if r.Secret == nil || r.ConfigMap != nil {
			return "", nil, fmt.Errorf("%s: a %s record needs Secret set and ConfigMap nil", key, r.Kind)
		}
		meta = objectMeta{r.Secret.Namespace, r.Secret.Name}
	}
	if err := meta.check(r.Namespace, r.Name); err != nil {
		return "", nil, fmt.Errorf("%s: %w", key, err)
	}
	if r.Source.Kind == "" {
		return "", nil, fmt.Errorf("%s: no source kind", key)
	}
	val, err = json.Marshal(objectRecord{
		Source:     sourceRecord{Kind: string(r.Source.Kind), Origin: r.Source.Origin, Doc: r.Source.Doc},
		Generation: r.Generation,
		ConfigMap:  r.ConfigMap,
		Secret:     r.Secret,
	})
	if err != nil {
		return "", nil, fmt.Errorf("encode %s: %w", key, err)
	}
	return key, val, nil
}

// objectMeta is the namespace and name an object carries in its own metadata.
type objectMeta struct{ namespace, name string }

// check refuses an object whose metadata names another object than its record: it would be
// handed to pods under the wrong name. An empty namespace is the record's (a manifest may leave
// it out).
func (m objectMeta) check(namespace, name string) error {
	if m.name != name || (m.namespace != "" && m.namespace != namespace) {
		return fmt.Errorf("the object's metadata names %s/%s", m.namespace, m.name)
	}
	return nil
}

// decodeObject decodes the clear value stored under key; the error is a RecordError.
func decodeObject(key, val []byte) (ObjectRecord, error) {
	bad := func(err error) (ObjectRecord, error) {
		return ObjectRecord{}, RecordError{Bucket: string(bucketObjects), Key: string(key), Err: err}
	}
	kind, ns, name, ok := splitObjectKey(string(key))
	if !ok {
		return bad(errors.New("key is not <ConfigMap|Secret>/<namespace>/<name>"))
	}
	var r objectRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return bad(err)
	}
	var meta objectMeta
	switch {
	case kind == KindConfigMap && r.ConfigMap != nil && r.Secret == nil:
		meta = objectMeta{r.ConfigMap.Namespace, r.ConfigMap.Name}
	case kind == KindSecret && r.Secret != nil && r.ConfigMap == nil:
		meta = objectMeta{r.Secret.Namespace, r.Secret.Name}
	default:
		return bad(fmt.Errorf("record does not hold exactly one %s", kind))
	}
	if err := meta.check(ns, name); err != nil {
		return bad(err)
	}
	return ObjectRecord{
		Kind:       kind,
		Namespace:  ns,
		Name:       name,
		Generation: r.Generation,
		Source:     source.Ref{Kind: source.Kind(r.Source.Kind), Origin: r.Source.Origin, Doc: r.Source.Doc},
		ConfigMap:  r.ConfigMap,
		Secret:     r.Secret,
	}, nil
}

// collectObjects decodes every record a walk of objects yields, for DB and Memory alike; open
// turns a stored value into the clear one (unsealing Secrets on DB). The good records come
// sorted by kind, namespace and name.
func collectObjects(walk func(func(k, v []byte) error) error, open func(k, v []byte) ([]byte, error)) ([]ObjectRecord, []RecordError) {
	var out []ObjectRecord
	var bad []RecordError
	walk(func(k, v []byte) error {
		r, err := openAndDecodeObject(k, v, open)
		if err != nil {
			bad = append(bad, asRecordError(err))
		} else {
			out = append(out, r)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	sortRecordErrors(bad)
	return out, bad
}

func openAndDecodeObject(k, v []byte, open func(k, v []byte) ([]byte, error)) (ObjectRecord, error) {
	if v == nil {
		return ObjectRecord{}, RecordError{Bucket: string(bucketObjects), Key: string(k), Err: errors.New("a nested bucket, not a record")}
	}
	plain, err := open(k, v)
	if err != nil {
		return ObjectRecord{}, RecordError{Bucket: string(bucketObjects), Key: string(k), Err: err}
	}
	return decodeObject(k, plain)
}

// isSecretKey tells from an objects key whether its value is sealed.
func isSecretKey(key []byte) bool {
	return strings.HasPrefix(string(key), string(KindSecret)+"/")
}

// sealValue turns the clear value of the record under key into what is written: Secrets
// sealed, ConfigMaps as they are.
func (d *DB) sealValue(key string, val []byte) ([]byte, error) {
	if !isSecretKey([]byte(key)) {
		return val, nil
	}
	if d.box == nil {
		return nil, errNoKey
	}
	return d.box.Seal(val, sealData(key)), nil
}

// openValue is sealValue's inverse, for collectObjects.
func (d *DB) openValue(key, val []byte) ([]byte, error) {
	if !isSecretKey(key) {
		return val, nil
	}
	if d.box == nil {
		return nil, fmt.Errorf("sealed secret: %w", errNoKey)
	}
	return d.box.Open(val, sealData(string(key)))
}

// PutObject stores r under its kind, namespace and name, replacing any previous record there.
// A Secret is sealed under the node key first, and refused when the DB has none. Concurrent
// calls are folded into one transaction.
func (d *DB) PutObject(r ObjectRecord) error {
	key, val, err := encodeObject(r)
	if err != nil {
		return fmt.Errorf("state db %s: put object: %w", d.path, err)
	}
	// Sealed outside the batch (Batch may run the function more than once) and before anything
	// is written, so a missing key changes nothing.
	if val, err = d.sealValue(key, val); err != nil {
		return fmt.Errorf("state db %s: put object %s: %w", d.path, key, err)
	}
	err = d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketObjects)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), val)
	})
	if err != nil {
		return fmt.Errorf("state db %s: put object %s: %w", d.path, key, err)
	}
	return nil
}

// GetObject returns the object of kind in namespace/name, and false if there is none. A record
// that cannot be decoded or unsealed is an error (a RecordError naming bucket and key, wrapped).
func (d *DB) GetObject(kind ObjectKind, namespace, name string) (ObjectRecord, bool, error) {
	key, err := objectKey(kind, namespace, name)
	if err != nil {
		return ObjectRecord{}, false, fmt.Errorf("state db %s: get object: %w", d.path, err)
	}
	var (
		r     ObjectRecord
		found bool
	)
	err = d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketObjects)
		if err != nil {
			return err
		}
		val := b.Get([]byte(key))
		if val == nil {
			return nil
		}
		found = true
		r, err = openAndDecodeObject([]byte(key), val, d.openValue)
		return err
	})
	if err != nil {
		return ObjectRecord{}, false, fmt.Errorf("state db %s: get object %s: %w", d.path, key, err)
	}
	return r, found, nil
}

// ListObjects returns every stored ConfigMap and Secret sorted by kind, namespace and name, and a
// RecordError for each record that could not be decoded or unsealed (every Secret, when the DB
// has no node key) and was skipped.
func (d *DB) ListObjects() (out []ObjectRecord, bad []RecordError, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketObjects)
		if err != nil {
			return err
		}
		out, bad = collectObjects(b.ForEach, d.openValue)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("state db %s: list objects: %w", d.path, err)
	}
	return out, bad, nil
}

// DeleteObject removes the object of kind in namespace/name; a missing one is not an error. It
// needs no node key, so a Secret that can no longer be opened can still be removed.
func (d *DB) DeleteObject(kind ObjectKind, namespace, name string) error {
	key, err := objectKey(kind, namespace, name)
	if err != nil {
		return fmt.Errorf("state db %s: delete object: %w", d.path, err)
	}
	err = d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketObjects)
		if err != nil {
			return err
		}
		return b.Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("state db %s: delete object %s: %w", d.path, key, err)
	}
	return nil
}
