package manifest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// MaxFileSize is the largest manifest file read; larger files are a Problem. A pod manifest
// is a few KiB; a huge file is a mistake (a log or an image dropped in the wrong place).
const MaxFileSize = 1 << 20

// Dir is the manifest-dir source. It keeps, per file, the last good pods so that a file that
// turns invalid does NOT remove the pods it used to declare (bad input must not disturb what
// is running):
//   - file parses cleanly -> its pod set becomes exactly what it declares;
//   - file has problems   -> its new valid documents are applied, and pods it declared before
//     that are missing from the valid documents are kept as they were (Pod.Stale set, and
//     the Problems say why);
//   - file deleted        -> its pods go away.
//
// Duplicate namespace/name across files or documents: the first (files sorted by name, then
// document index) wins and the others are Problems naming both places.
type Dir struct {
	path string

	mu       sync.Mutex       // serialises scans: Scan may be called while Watch runs
	last     map[string][]Pod // file -> the pods it contributed at the last scan
	lastObjs map[string][]Object
	parsed   map[string]parseResult

	objects func(Snapshot) error // OnObjects
}

// parseResult caches what Parse made of a file's bytes: every change in the directory rescans
// every file, and parsing (YAML -> JSON -> strict decode -> validate) is what costs, so a burst of
// n new files would otherwise parse n^2 documents.
type parseResult struct {
	sum      [sha256.Size]byte
	pods     []Pod
	objs     []Object
	problems []Problem
}

// NewDir returns the source for the manifest directory path. A relative path is made absolute so
// that Pod.File and Problem.File are absolute.
func NewDir(path string) *Dir {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return &Dir{path: path, last: map[string][]Pod{}, lastObjs: map[string][]Object{}, parsed: map[string]parseResult{}}
}

// Path is the directory watched.
func (d *Dir) Path() string { return d.path }

// Snapshot is the state of the directory after one scan.
type Snapshot struct {
	Pods     []Pod     // sorted by namespace/name
	Objects  []Object  // ConfigMaps and Secrets, sorted by Key
	Problems []Problem // sorted by file, index
}

// IsManifestName reports whether a directory entry name is considered a manifest: it ends in
// .yaml, .yml or .json and is neither hidden nor an editor's temporary file.
func IsManifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	for _, suffix := range []string{"~", ".swp", ".tmp"} {
		if strings.HasSuffix(name, suffix) {
			return false
		}
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// Scan reads the directory now and returns the resulting snapshot, updating the per-file
// memory. A missing directory is not an error (empty snapshot, no problems): it may be
// created later. The returned pods are copies the caller may keep and modify.
func (d *Dir) Scan() (Snapshot, error) {
	d.mu.Lock()
	defer d.mu.Unlock()

	entries, err := os.ReadDir(d.path)
	if errors.Is(err, fs.ErrNotExist) {
		d.last, d.lastObjs = map[string][]Pod{}, map[string][]Object{}
		return Snapshot{}, nil
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("reading manifest directory %s: %w", d.path, err)
	}

	next := map[string][]Pod{}
	nextObjs := map[string][]Object{}
	parsed := map[string]parseResult{}
	var problems []Problem
	var files []string // in name order, as os.ReadDir returns them
	for _, e := range entries {
		if !IsManifestName(e.Name()) {
			continue
		}
		file := filepath.Join(d.path, e.Name())
		data, gone, err := readManifest(file, e)
		if gone {
			continue
		}
		files = append(files, file)
		var pods []Pod
		var objs []Object
		var probs []Problem
		if err != nil {
			probs = []Problem{{File: file, Index: -1, Err: err}}
		} else {
			pods, objs, probs = d.parse(file, data, parsed)
			if len(pods) == 0 && len(objs) == 0 && len(probs) == 0 && blankFile(file, data) {
				// A file truncated at power loss (or mid-write) reads as empty: treat it like an
				// unreadable one, so the pods it declared before stay. Removing the file is
				// how its pods are deleted.
				probs = []Problem{{File: file, Index: -1, Empty: true,
					Err: errors.New("file is empty (no pod document); the pods it declared before are kept until it is fixed or removed")}}
			}
		}
		if len(probs) > 0 {
			pods = keepPrevious(pods, d.last[file])
			objs = keepPreviousObjects(objs, d.lastObjs[file])
		}
		next[file] = pods
		nextObjs[file] = objs
		problems = append(problems, probs...)
	}
	d.last, d.lastObjs, d.parsed = next, nextObjs, parsed

	// Resolve duplicates in (file, index) order so the winner does not depend on map order
	// or on which file changed last.
	winner := map[string]Pod{}
	var out []Pod
	for _, file := range files {
		for _, p := range next[file] {
			key := p.Pod.Namespace + "/" + p.Pod.Name
			if first, dup := winner[key]; dup {
				problems = append(problems, Problem{File: p.File, Index: p.Index, Line: p.Line, Duplicate: true,
					Err: fmt.Errorf("pod %s is already declared in %s, document %d; this one is ignored", key, first.File, first.Index)})
				continue
			}
			winner[key] = p
			c := p
			c.Pod = p.Pod.DeepCopy()
			out = append(out, c)
		}
	}
	objWinner := map[string]Object{}
	var outObjs []Object
	for _, file := range files {
		for _, o := range nextObjs[file] {
			if first, dup := objWinner[o.Key()]; dup {
				problems = append(problems, Problem{File: o.File, Index: o.Index, Line: o.Line, Duplicate: true,
					Err: fmt.Errorf("%s is already declared in %s, document %d; this one is ignored", o.Key(), first.File, first.Index)})
				continue
			}
			objWinner[o.Key()] = o
			outObjs = append(outObjs, o.deepCopy())
		}
	}
	sort.Slice(outObjs, func(i, j int) bool { return outObjs[i].Key() < outObjs[j].Key() })
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pod.Namespace != out[j].Pod.Namespace {
			return out[i].Pod.Namespace < out[j].Pod.Namespace
		}
		return out[i].Pod.Name < out[j].Pod.Name
	})
	sort.SliceStable(problems, func(i, j int) bool {
		if problems[i].File != problems[j].File {
			return problems[i].File < problems[j].File
		}
		return problems[i].Index < problems[j].Index
	})
	return Snapshot{Pods: out, Objects: outObjs, Problems: problems}, nil
}

// parse returns Parse's result for data, reusing the last one when the bytes are unchanged, and
// records it in next.
func (d *Dir) parse(file string, data []byte, next map[string]parseResult) ([]Pod, []Object, []Problem) {
	sum := sha256.Sum256(data)
	r, ok := d.parsed[file]
	if !ok || r.sum != sum {
		r.sum = sum
		r.pods, r.objs, r.problems = ParseAll(file, data)
	}
	next[file] = r
	return r.pods, r.objs, r.problems
}

// keepPrevious adds to a file's valid pods the ones it declared at the previous scan and no
// longer declares validly, in document order.
func keepPrevious(valid, previous []Pod) []Pod {
	have := map[string]bool{}
	for _, p := range valid {
		have[p.Pod.Namespace+"/"+p.Pod.Name] = true
	}
	out := append([]Pod(nil), valid...) // valid may be a cached parse result: don't write into it
	for _, p := range previous {
		if !have[p.Pod.Namespace+"/"+p.Pod.Name] {
			p.Stale = true
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// readManifest reads one candidate file. gone reports that it vanished (or is a directory)
// and is simply not part of the directory any more; err is a problem with the file itself.
func readManifest(file string, e fs.DirEntry) (data []byte, gone bool, err error) {
	info, err := os.Stat(file) // follows symlinks
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if e.Type()&fs.ModeSymlink != 0 {
				target, _ := os.Readlink(file)
				return nil, false, fmt.Errorf("symlink target %s does not exist", target)
			}
			return nil, true, nil // removed since the directory was listed
		}
		return nil, false, withoutPath(err)
	}
	if info.IsDir() {
		return nil, true, nil
	}
	if !info.Mode().IsRegular() {
		// Opening a FIFO would block the scan.
		return nil, false, fmt.Errorf("not a regular file (mode %s)", info.Mode())
	}
	if info.Size() > MaxFileSize {
		return nil, false, fmt.Errorf("file is %d bytes, larger than the %d byte limit for a manifest", info.Size(), MaxFileSize)
	}
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, true, nil
		}
		return nil, false, withoutPath(err)
	}
	defer f.Close()
	// The file may grow between Stat and Read.
	data, err = io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, false, withoutPath(err)
	}
	if len(data) > MaxFileSize {
		return nil, false, fmt.Errorf("file is larger than the %d byte limit for a manifest", MaxFileSize)
	}
	return data, false, nil
}

// withoutPath drops the path from an *fs.PathError: Problem.Error already names the file.
func withoutPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}
