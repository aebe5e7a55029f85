package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"time"
)

// bbolt's file format version 2, as far as bolt.Open reads it. Every page starts with a 16-byte
// header: id uint64, flags uint16, count uint16, overflow uint32. Pages 0 and 1 are meta pages;
// after the header comes magic, version, page size, flags (uint32 each), the root bucket (page id,
// sequence), the freelist page id, the high-water mark (pages in use) and the txid (uint64 each),
// then an FNV-64a checksum of everything before it. Integers are in host byte order.
const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	pageHeaderSize   = 16
	metaSize         = 64
	metaChecksumFrom = 56
	flagFreelistPage = 0x10
	noFreelist       = ^uint64(0)
)

var hostEndian = binary.NativeEndian

type metaPage struct {
	pageSize uint32
	root     uint64
	freelist uint64
	hwm      uint64 // pages below this id are in use; the file must hold them all
	txid     uint64
}

func readMeta(r io.ReaderAt, pageStart int64) (metaPage, error) {
	buf := make([]byte, pageHeaderSize+metaSize)
	if _, err := r.ReadAt(buf, pageStart); err != nil {
		return metaPage{}, fmt.Errorf("read at offset %d: %w", pageStart, err)
	}
	m := buf[pageHeaderSize:]
	if magic := hostEndian.Uint32(m[0:]); magic != boltMagic {
		return metaPage{}, fmt.Errorf("bad magic %#x", magic)
	}
	if v := hostEndian.Uint32(m[4:]); v != boltVersion {
		return metaPage{}, fmt.Errorf("bbolt format version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	h.Write(m[:metaChecksumFrom])
	if got, want := hostEndian.Uint64(m[metaChecksumFrom:]), h.Sum64(); got != want {
		return metaPage{}, fmt.Errorf("checksum %#x, computed %#x", got, want)
	}
	return metaPage{
		pageSize: hostEndian.Uint32(m[8:]),
		root:     hostEndian.Uint64(m[16:]),
		freelist: hostEndian.Uint64(m[32:]),
		hwm:      hostEndian.Uint64(m[40:]),
		txid:     hostEndian.Uint64(m[48:]),
	}, nil
}

// precheck reads, without writing and under a shared lock, everything of an existing file that
// bolt.Open itself reads, and refuses the file if bolt.Open could panic or fault on it. It returns
// a notice when one meta page is bad: bbolt then opens from the other one, which is its designed
// recovery from a torn commit and loses at most the last transaction (which the pod sources and
// containerd replay), so that case is reported rather than refused.
func precheck(path string, timeout time.Duration) (notice string, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("open state db %s: %w", path, err)
	}
	defer f.Close() // also drops the lock
	// Holding the lock keeps a running agent from changing the file while it is read here.
	if err := lockShared(f, timeout); err != nil {
		if errors.Is(err, errLockTimeout) {
			return "", lockedError(path, timeout, err)
		}
		return "", fmt.Errorf("open state db %s: lock: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("open state db %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("open state db %s: not a regular file (%s)", path, st.Mode().Type())
	}
	size := st.Size()
	if size == 0 {
		return "", nil
	}

	// The page size is recorded in the meta pages; meta page 1 sits one page in, so if page 0 is
	// bad, look for page 1 at each plausible page size, as bbolt does.
	m0, err0 := readMeta(f, 0)
	pageSize := int64(m0.pageSize)
	if err0 != nil {
		for ps := int64(1024); ps <= 1<<24 && ps+pageHeaderSize+metaSize <= size; ps <<= 1 {
			if m, err := readMeta(f, ps); err == nil && int64(m.pageSize) == ps {
				pageSize = ps
				break
			}
		}
		if pageSize == 0 {
			return "", corruptError(path, fmt.Errorf("no valid bbolt meta page (meta page 0: %v)", err0))
		}
	}
	if pageSize < 1024 || pageSize&(pageSize-1) != 0 {
		return "", corruptError(path, fmt.Errorf("page size %d in meta page", pageSize))
	}
	m1, err1 := readMeta(f, pageSize)
	if err0 != nil && err1 != nil {
		return "", corruptError(path, fmt.Errorf("both meta pages are bad: meta page 0: %v; meta page 1: %v", err0, err1))
	}
	// bbolt uses the valid meta page with the higher txid.
	meta, bad, badErr := m0, 1, err1
	if err0 != nil || (err1 == nil && m1.txid > m0.txid) {
		meta, bad, badErr = m1, 0, err0
	}
	if int64(meta.pageSize) != pageSize {
		return "", corruptError(path, fmt.Errorf("meta pages disagree on the page size (%d, %d)", m0.pageSize, m1.pageSize))
	}
	if badErr != nil {
		notice = fmt.Sprintf("state db %s: meta page %d is bad (%v); bbolt opened it from meta page %d, "+
			"so the last write before it may be lost (check the storage if this repeats)", path, bad, badErr, 1-bad)
	}

	// Pages past the end of the file are mapped but not backed: touching one is SIGBUS.
	if meta.hwm < 4 || meta.hwm > uint64(size/pageSize) {
		return "", corruptError(path, fmt.Errorf("file is %d bytes (%d pages of %d) but its meta page says %d pages are in use: truncated",
			size, size/pageSize, pageSize, meta.hwm))
	}
	if meta.root < 2 || meta.root >= meta.hwm {
		return "", corruptError(path, fmt.Errorf("root page %d outside [2, %d)", meta.root, meta.hwm))
	}
	if meta.freelist == noFreelist {
		// bolt.Open would rebuild and write the freelist: a write we must not make to a file that
		// mqlet did not write (mqlet always keeps the freelist).
		return "", fmt.Errorf("open state db %s: %w: a bbolt file without a stored freelist, which mqlet never writes; "+
			"check the state dir, or move the file aside (mv %s %s.foreign)", path, ErrCorrupt, path, path)
	}
	if err := checkFreelist(f, meta, pageSize); err != nil {
		return "", corruptError(path, err)
	}
	if err := checkTree(f, meta, pageSize); err != nil {
		return "", corruptError(path, err)
	}
	return notice, nil
}

// bbolt's branch and leaf pages: after the page header come count elements of 16 bytes each; a
// branch element is pos, ksize (uint32) and the child page id (uint64), a leaf element is flags,
// pos, ksize and vsize (uint32 each). pos is counted from the element itself; a leaf's value
// follows its key. A leaf element with flagBucket holds a bucket: its value starts with the
// bucket's root page id and sequence (uint64 each), and a root of 0 means the bucket is inline,
// its one leaf page stored in the value after those 16 bytes.
const (
	flagBranchPage   = 0x01
	flagLeafPage     = 0x02
	flagBucket       = 0x01
	elementSize      = 16
	bucketHeaderSize = 16
	// maxTreeDepth bounds the recursion: a real state file nests a handful of levels.
	maxTreeDepth = 64
)

// checkTree reads, with plain reads, every branch and leaf page reachable from the root bucket,
// nested buckets included, and checks that each element, key and value lies inside its page and
// that no page is reachable twice. bbolt's own check (tx.Check) does not look at element bounds:
// a flipped bit in a value's length makes a value that runs across the following pages, which
// reads fine and then faults or allocates gigabytes the first time bbolt rewrites that page.
func checkTree(r io.ReaderAt, meta metaPage, pageSize int64) error {
	t := treeCheck{r: r, hwm: meta.hwm, pageSize: uint64(pageSize), seen: map[uint64]bool{}}
	return t.page(meta.root, 0)
}

type treeCheck struct {
	r        io.ReaderAt
	hwm      uint64
	pageSize uint64
	seen     map[uint64]bool
}

// page checks the on-disk page id and everything below it.
func (t *treeCheck) page(id uint64, depth int) error {
	if depth > maxTreeDepth {
		return fmt.Errorf("page %d: tree deeper than %d levels", id, maxTreeDepth)
	}
	if id < 2 || id >= t.hwm {
		return fmt.Errorf("page %d referenced, outside [2, %d)", id, t.hwm)
	}
	if t.seen[id] {
		return fmt.Errorf("page %d referenced twice", id)
	}
	hdr := make([]byte, pageHeaderSize)
	if _, err := t.r.ReadAt(hdr, int64(id*t.pageSize)); err != nil {
		return fmt.Errorf("read page %d: %w", id, err)
	}
	overflow := uint64(hostEndian.Uint32(hdr[12:]))
	if got := hostEndian.Uint64(hdr); got != id {
		return fmt.Errorf("page %d: header says page %d", id, got)
	}
	if id+overflow >= t.hwm {
		return fmt.Errorf("page %d: %d overflow pages run past page %d", id, overflow, t.hwm)
	}
	for i := uint64(0); i <= overflow; i++ {
		if t.seen[id+i] {
			return fmt.Errorf("page %d referenced twice", id+i)
		}
		t.seen[id+i] = true
	}
	buf := make([]byte, (overflow+1)*t.pageSize)
	if _, err := t.r.ReadAt(buf, int64(id*t.pageSize)); err != nil {
		return fmt.Errorf("read page %d: %w", id, err)
	}
	return t.node(buf, fmt.Sprintf("page %d", id), depth)
}

// node checks one branch or leaf page held in buf (an inline bucket's page is a slice of a value).
func (t *treeCheck) node(buf []byte, name string, depth int) error {
	if len(buf) < pageHeaderSize {
		return fmt.Errorf("%s: %d bytes, shorter than a page header", name, len(buf))
	}
	flags, count := hostEndian.Uint16(buf[8:]), uint64(hostEndian.Uint16(buf[10:]))
	size := uint64(len(buf))
	if pageHeaderSize+count*elementSize > size {
		return fmt.Errorf("%s: %d elements do not fit in %d bytes", name, count, size)
	}
	for i := uint64(0); i < count; i++ {
		at := pageHeaderSize + i*elementSize
		e := buf[at : at+elementSize]
		switch flags {
		case flagBranchPage:
			pos, ksize := uint64(hostEndian.Uint32(e)), uint64(hostEndian.Uint32(e[4:]))
			if at+pos+ksize > size {
				return fmt.Errorf("%s: key of branch element %d runs past the page", name, i)
			}
			if err := t.page(hostEndian.Uint64(e[8:]), depth+1); err != nil {
				return err
			}
		case flagLeafPage:
			ef, pos := hostEndian.Uint32(e), uint64(hostEndian.Uint32(e[4:]))
			ksize, vsize := uint64(hostEndian.Uint32(e[8:])), uint64(hostEndian.Uint32(e[12:]))
			if at+pos+ksize+vsize > size {
				return fmt.Errorf("%s: key and value of leaf element %d (%d + %d bytes) run past the page", name, i, ksize, vsize)
			}
			if ef&flagBucket == 0 {
				continue
			}
			v := buf[at+pos+ksize : at+pos+ksize+vsize]
			if len(v) < bucketHeaderSize {
				return fmt.Errorf("%s: bucket element %d has a %d-byte value, shorter than a bucket header", name, i, len(v))
			}
			var err error
			if root := hostEndian.Uint64(v); root == 0 {
				err = t.node(v[bucketHeaderSize:], fmt.Sprintf("inline bucket in %s", name), depth+1)
			} else {
				err = t.page(root, depth+1)
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: flags %#x, want a branch (%#x) or leaf (%#x) page", name, flags, flagBranchPage, flagLeafPage)
		}
	}
	if count == 0 && flags != flagBranchPage && flags != flagLeafPage {
		return fmt.Errorf("%s: flags %#x, want a branch (%#x) or leaf (%#x) page", name, flags, flagBranchPage, flagLeafPage)
	}
	return nil
}

// checkFreelist checks the freelist page the way bolt.Open will read it, which panics on a
// page of the wrong type and trusts its element count.
func checkFreelist(r io.ReaderAt, meta metaPage, pageSize int64) error {
	if meta.freelist < 2 || meta.freelist >= meta.hwm {
		return fmt.Errorf("freelist page %d outside [2, %d)", meta.freelist, meta.hwm)
	}
	hdr := make([]byte, pageHeaderSize+8)
	if _, err := r.ReadAt(hdr, int64(meta.freelist)*pageSize); err != nil {
		return fmt.Errorf("read freelist page %d: %w", meta.freelist, err)
	}
	id, flags := hostEndian.Uint64(hdr), hostEndian.Uint16(hdr[8:])
	count, overflow := uint64(hostEndian.Uint16(hdr[10:])), uint64(hostEndian.Uint32(hdr[12:]))
	if id != meta.freelist || flags != flagFreelistPage {
		return fmt.Errorf("freelist page %d: header says page %d with flags %#x, want flags %#x", meta.freelist, id, flags, flagFreelistPage)
	}
	if meta.freelist+overflow >= meta.hwm {
		return fmt.Errorf("freelist page %d: %d overflow pages run past page %d", meta.freelist, overflow, meta.hwm)
	}
	start := uint64(pageHeaderSize)
	if count == 0xFFFF { // the real count is in the first element
		count = hostEndian.Uint64(hdr[pageHeaderSize:])
		start += 8
	}
	capacity := ((overflow+1)*uint64(pageSize) - start) / 8
	if count > capacity {
		return fmt.Errorf("freelist page %d: %d entries do not fit in %d pages", meta.freelist, count, overflow+1)
	}
	ids := make([]byte, count*8)
	if _, err := r.ReadAt(ids, int64(meta.freelist)*pageSize+int64(start)); err != nil {
		return fmt.Errorf("read freelist page %d: %w", meta.freelist, err)
	}
	for i := uint64(0); i < count; i++ {
		if p := hostEndian.Uint64(ids[i*8:]); p < 2 || p >= meta.hwm {
			return fmt.Errorf("freelist page %d: free page %d outside [2, %d)", meta.freelist, p, meta.hwm)
		}
	}
	return nil
}
