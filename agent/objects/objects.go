// Package objects keeps the ConfigMaps and Secrets that pods use. Both sources deliver them: the
// manifest dir (SyncFiles, the whole set of its files each time) and the MQTT downlink (through
// Guard, one object at a time). The package decides which source owns a name (the first to claim
// it; the second is refused with a message naming the owner, as pods are), writes the store
// (Secrets sealed there), reads objects back for the runtime (ctrspec.Objects) and tells the agent
// when one changes, so the pods that use it are looked at again.
package objects

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Key names a stored object.
type Key struct {
	Kind      store.ObjectKind
	Namespace string
	Name      string
}

func (k Key) String() string { return string(k.Kind) + " " + k.Namespace + "/" + k.Name }

func keyOf(r store.ObjectRecord) Key { return Key{r.Kind, r.Namespace, r.Name} }

// ClaimError refuses an object whose name another source already defines.
type ClaimError struct {
	Key      Key
	Owner    source.Ref  // where the stored object came from
	Claimant source.Kind // the source that was refused
}

func (e *ClaimError) Error() string {
	return fmt.Sprintf("%s is already defined by %s; this one from %s is ignored", e.Key, e.Owner, e.Claimant)
}

// Refusal marks the error as a verdict on the input rather than a failure to retry: the downlink
// reports it to the control plane instead of trying again at the next delivery.
func (e *ClaimError) Refusal() {}

// Store is the agent's view of its stored ConfigMaps and Secrets. It is safe for concurrent use.
type Store struct {
	st  store.State
	log *slog.Logger

	// mu serialises the check of who owns a name with the write that follows, across the two
	// sources. Only the sources' goroutines take it; routing, the API and the workers never do.
	mu      sync.Mutex
	refused map[Key]string // claims refused at the last file sync, so a resync repeats no event

	events   atomic.Pointer[event.Sink]
	onChange atomic.Pointer[func(Key)]
}

// New reads and writes objects in st.
func New(st store.State, log *slog.Logger) *Store {
	if log == nil {
		log = slog.Default()
	}
	return &Store{st: st, log: log, refused: map[Key]string{}}
}

// Connect sets where refusals are reported and who is told of every change (the agent, which
// nudges the pods that use the object). Objects changed before Connect are not announced: no pod
// runs yet then.
func (s *Store) Connect(events event.Sink, onChange func(Key)) {
	if events != nil {
		s.events.Store(&events)
	}
	if onChange != nil {
		s.onChange.Store(&onChange)
	}
}

func (s *Store) changed(k Key) {
	if fn := s.onChange.Load(); fn != nil {
		(*fn)(k)
	}
}

func (s *Store) emit(e event.Event) {
	if sink := s.events.Load(); sink != nil {
		(*sink).Emit(e)
	}
}

// ConfigMap implements ctrspec.Objects.
func (s *Store) ConfigMap(namespace, name string) (*v1.ConfigMap, error) {
	r, ok, err := s.st.GetObject(store.KindConfigMap, namespace, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &ctrspec.NotFoundError{Kind: string(store.KindConfigMap), Namespace: namespace, Name: name}
	}
	return r.ConfigMap, nil
}

// Secret implements ctrspec.Objects. stringData is folded into data, as the API server does on
// write, so users of the Secret read data alone.
func (s *Store) Secret(namespace, name string) (*v1.Secret, error) {
	r, ok, err := s.st.GetObject(store.KindSecret, namespace, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &ctrspec.NotFoundError{Kind: string(store.KindSecret), Namespace: namespace, Name: name}
	}
	return FoldStringData(r.Secret), nil
}

// FoldStringData returns s with stringData merged into data (stringData wins) and cleared; s is
// returned as it is when it has none.
func FoldStringData(s *v1.Secret) *v1.Secret {
	if len(s.StringData) == 0 {
		return s
	}
	out := s.DeepCopy()
	if out.Data == nil {
		out.Data = map[string][]byte{}
	}
	for k, v := range out.StringData {
		out.Data[k] = []byte(v)
	}
	out.StringData = nil
	return out
}

// Guard returns st with its object writes going through s on behalf of source kind (the MQTT
// downlink's store): a put of a name another source owns fails with a *ClaimError, and a delete of
// one is ignored. Everything else goes straight to st.
func (s *Store) Guard(st store.State, kind source.Kind) store.State {
	return guarded{State: st, s: s, kind: kind}
}

type guarded struct {
	store.State
	s    *Store
	kind source.Kind
}

func (g guarded) PutObject(r store.ObjectRecord) error {
	if r.Source.Kind == "" {
		r.Source.Kind = g.kind
	}
	return g.s.put(g.State, r)
}

func (g guarded) DeleteObject(kind store.ObjectKind, namespace, name string) error {
	return g.s.delete(g.State, g.kind, Key{kind, namespace, name})
}

// put stores r unless another source owns its name; a change is announced.
func (s *Store) put(st store.State, r store.ObjectRecord) error {
	k := keyOf(r)
	s.mu.Lock()
	old, found, err := st.GetObject(k.Kind, k.Namespace, k.Name)
	if err != nil {
		// A record that cannot be read (sealed under a lost key) belongs to no one any more.
		s.log.Warn("stored object unreadable; replacing it", "object", k.String(), "err", err)
		found = false
	}
	if found && old.Source.Kind != r.Source.Kind {
		s.mu.Unlock()
		return &ClaimError{Key: k, Owner: old.Source, Claimant: r.Source.Kind}
	}
	same := found && sameRecord(old, r)
	if !same {
		err = st.PutObject(r)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if !same {
		s.changed(k)
	}
	return nil
}

// delete removes the object of k if source kind owns it (or it cannot be read any more).
func (s *Store) delete(st store.State, kind source.Kind, k Key) error {
	s.mu.Lock()
	old, found, err := st.GetObject(k.Kind, k.Namespace, k.Name)
	if err == nil && found && old.Source.Kind != kind {
		s.mu.Unlock()
		s.log.Info("not deleting an object another source defines", "object", k.String(), "owner", old.Source.String(), "asked by", kind)
		return nil
	}
	if err == nil && !found {
		s.mu.Unlock()
		return nil
	}
	err = st.DeleteObject(k.Kind, k.Namespace, k.Name)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.changed(k)
	return nil
}

// sameRecord reports whether storing b over a would change nothing a reader sees.
func sameRecord(a, b store.ObjectRecord) bool {
	return a.Source == b.Source && a.Generation == b.Generation &&
		equality.Semantic.DeepEqual(a.ConfigMap, b.ConfigMap) && equality.Semantic.DeepEqual(a.Secret, b.Secret)
}

// SyncFiles makes the stored objects of the manifest dir exactly items: new and changed ones are
// put, those no file declares any more are deleted, except those stored from a kept file (one that
// cannot be read cleanly now, or a directory above it): a half-written file at power loss must not
// take a Secret away from running pods, even after a reboot. A name MQTT already defines is refused
// (an event when the refusal is new) and returned. The error says which puts and deletes the store
// failed (a full disk): the caller delivers the directory again until none fails, since nothing
// else would bring the change back.
func (s *Store) SyncFiles(items []store.ObjectRecord, kept []string) ([]*ClaimError, error) {
	stored, bad, err := s.st.ListObjects()
	if err != nil {
		s.log.Error("manifest objects: list stored objects; not applying the change", "err", err)
		return nil, fmt.Errorf("manifest objects: list stored objects: %w", err)
	}
	var failed []error
	for _, e := range bad {
		s.log.Warn("manifest objects: a stored object is unreadable", "err", e)
	}
	byKey := make(map[Key]store.ObjectRecord, len(stored))
	for _, r := range stored {
		byKey[keyOf(r)] = r
	}
	want := make(map[Key]bool, len(items))
	var refused []*ClaimError
	nowRefused := map[Key]string{}
	for _, r := range items {
		r.Source.Kind = source.File
		k := keyOf(r)
		want[k] = true
		if err := s.put(s.st, r); err != nil {
			if ce, ok := err.(*ClaimError); ok {
				refused = append(refused, ce)
				nowRefused[k] = ce.Error()
				if s.refusedBefore(k, ce.Error()) {
					continue
				}
				s.log.Error("manifest object refused", "object", k.String(), "file", r.Source.String(), "problem", ce.Error())
				s.emit(event.Event{Time: time.Now(), Type: event.Warning, Reason: event.ReasonNameClash, Message: ce.Error(),
					Object: event.Object{Kind: string(k.Kind), Namespace: k.Namespace, Name: k.Name}, Source: r.Source.String()})
				continue
			}
			s.log.Error("manifest objects: store", "object", k.String(), "file", r.Source.String(), "err", err)
			failed = append(failed, fmt.Errorf("store %s from %s: %w", k, r.Source, err))
		}
	}
	for k, r := range byKey {
		if r.Source.Kind != source.File || want[k] || keptOrigin(r.Source.Origin, kept) {
			continue
		}
		if err := s.delete(s.st, source.File, k); err != nil {
			s.log.Error("manifest objects: delete", "object", k.String(), "err", err)
			failed = append(failed, fmt.Errorf("delete %s: %w", k, err))
		} else {
			s.log.Info("object removed: no manifest declares it any more", "object", k.String())
		}
	}
	s.mu.Lock()
	s.refused = nowRefused
	s.mu.Unlock()
	return refused, errors.Join(failed...)
}

func (s *Store) refusedBefore(k Key, msg string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused[k] == msg
}

func keptOrigin(origin string, kept []string) bool {
	for _, k := range kept {
		if origin == k || strings.HasPrefix(origin, k+string(filepath.Separator)) {
			return true
		}
	}
	return false
}
