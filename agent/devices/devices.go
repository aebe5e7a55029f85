// Package devices offers host device nodes (serial ports, GPIO chips, cameras) to pods as extended
// resources, without a device plugin daemon: the agent config names a resource, the globs that find
// its nodes and how many containers may hold one node at a time; a pod asks for them in
// resources.limits and its containers get exactly the nodes allocated to them.
//
// The Manager keeps allocations in memory only. The runtime persists each pod's allocation in the pod
// dir and gives it back with Restore when the agent starts, before any new allocation.
package devices

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/mqlet/mqlet/agent/config"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// DefaultRescanInterval bounds how often Capacity looks for devices that appeared or vanished. A scan
// is a glob and a stat per match under /dev; the node status loop calls Capacity every few seconds.
const DefaultRescanInterval = 5 * time.Second

// Manager finds the devices of each configured resource and hands them to pods' containers.
type Manager struct {
	root   string // the globs are resolved below it: "/" on a node, a temp dir in tests
	res    map[v1.ResourceName]config.DeviceResource
	names  []v1.ResourceName // sorted
	log    *slog.Logger
	every  time.Duration
	scanMu sync.Mutex // one scan at a time; never held with mu

	mu      sync.Mutex
	present map[v1.ResourceName][]string // device paths (as the globs name them) seen by the last scan, sorted
	scanned time.Time
	pods    map[types.UID]Allocation
}

// New makes a Manager for resources, whose globs are resolved below root ("" or "/" on a node). It
// scans once at once, so Capacity is right from the start. log may be nil.
func New(resources []config.DeviceResource, root string, log *slog.Logger) *Manager {
	if root == "" {
		root = "/"
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{root: filepath.Clean(root), res: map[v1.ResourceName]config.DeviceResource{}, log: log,
		every: DefaultRescanInterval, present: map[v1.ResourceName][]string{}, pods: map[types.UID]Allocation{}}
	for _, r := range resources {
		r.Globs = slices.Clone(r.Globs)
		r.Share = max(r.Share, 1)
		m.res[r.Name] = r
		m.names = append(m.names, r.Name)
	}
	slices.Sort(m.names)
	m.Rescan()
	return m
}

// SetRescanInterval changes how stale the device list may get before Capacity scans again (tests use
// 0: every call scans).
func (m *Manager) SetRescanInterval(d time.Duration) {
	m.mu.Lock()
	m.every = d
	m.mu.Unlock()
}

// Resources lists the resource names the Manager offers, sorted.
func (m *Manager) Resources() []v1.ResourceName { return slices.Clone(m.names) }

// Offers reports whether name is one of the Manager's resources.
func (m *Manager) Offers(name v1.ResourceName) bool {
	_, ok := m.res[name]
	return ok
}

// Capacity is, for every configured resource, the devices present times how many containers may
// share one. A resource with no device present is listed with 0, so the node says it has none
// rather than not knowing the name. The device list is rescanned when older than the rescan
// interval, so USB devices that appear or vanish change it.
func (m *Manager) Capacity() v1.ResourceList {
	m.mu.Lock()
	stale := time.Since(m.scanned) >= m.every
	m.mu.Unlock()
	if stale {
		m.Rescan()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := v1.ResourceList{}
	for _, n := range m.names {
		out[n] = *resource.NewQuantity(int64(len(m.present[n])*m.res[n].Share), resource.DecimalSI)
	}
	return out
}

// Allocatable equals Capacity: no device is reserved for the system.
func (m *Manager) Allocatable() v1.ResourceList { return m.Capacity() }

// Rescan looks for the devices of every resource now. The file system is read without the lock the
// allocation state is under.
func (m *Manager) Rescan() {
	m.scanMu.Lock()
	defer m.scanMu.Unlock()
	found := map[v1.ResourceName][]string{}
	for _, n := range m.names {
		found[n] = m.scan(m.res[n])
	}
	m.mu.Lock()
	old, first := m.present, m.scanned.IsZero()
	m.present, m.scanned = found, time.Now()
	m.mu.Unlock()
	for _, n := range m.names {
		switch {
		case first:
			m.log.Info("host devices", "resource", n, "devices", found[n], "share", m.res[n].Share)
		case !slices.Equal(old[n], found[n]):
			m.log.Info("host devices changed", "resource", n, "devices", found[n], "before", old[n])
		}
	}
}

// scan returns the device paths r's globs find, sorted and without duplicates: a path counts only if
// it resolves (symlinks followed, never out of root) to a character or block device node. Two paths
// reaching the same node (a by-id symlink and the node itself) are one device: the first path wins.
func (m *Manager) scan(r config.DeviceResource) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range r.Globs {
		matches, err := filepath.Glob(filepath.Join(globEscape(m.root), g))
		if err != nil {
			m.log.Warn("device glob", "resource", r.Name, "glob", g, "err", err)
			continue
		}
		slices.Sort(matches)
		for _, match := range matches {
			p, ok := m.relPath(match)
			if !ok {
				continue
			}
			host, err := m.hostPath(p)
			if err != nil || seen[host] {
				continue
			}
			if _, err := statDevice(host); err != nil {
				continue
			}
			seen[host] = true
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// relPath turns a glob match below root back into the path as the glob names it ("/dev/ttyUSB0").
func (m *Manager) relPath(match string) (string, bool) {
	if m.root == "/" {
		return match, true
	}
	rest, ok := strings.CutPrefix(match, m.root)
	if !ok || !strings.HasPrefix(rest, "/") {
		return "", false
	}
	return rest, true
}

// hostPath resolves a device path as if root were "/": symlinks, absolute or relative, cannot lead
// out of root (a link to /dev/mem under a test root is looked up below that root).
func (m *Manager) hostPath(p string) (string, error) {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return "", fmt.Errorf("device path %q must be absolute and clean", p)
	}
	return securejoin.SecureJoin(m.root, p)
}

// globEscape quotes the glob metacharacters of a literal path, so an odd root is not a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Node is a device node as the container gets it: at Path inside the container, made like the host
// node at HostPath.
type Node struct {
	Path     string // in the container, as the config's glob names it
	HostPath string // the node it resolves to on the host
	Type     string // "c" or "b"
	Major    int64
	Minor    int64
	Mode     fs.FileMode // permission bits
	UID, GID uint32
}

// Node looks up the device at path (as Allocate returned it) on the host now: a USB device that was
// re-plugged may have new numbers, and one that is gone is an error naming it.
func (m *Manager) Node(path string) (Node, error) {
	host, err := m.hostPath(path)
	if err != nil {
		return Node{}, err
	}
	n, err := statDevice(host)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Node{}, fmt.Errorf("device %s is gone (unplugged?)", path)
		}
		return Node{}, fmt.Errorf("device %s: %w", path, err)
	}
	n.Path = path
	return n, nil
}
