package hw

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFilesystemWith(t *testing.T) {
	fake := func(path string, st *unix.Statfs_t) error {
		if path != "/var/lib/mqlet" {
			return unix.ENOENT
		}
		// An SD card with 4 KiB fragments: 1,000,000 blocks, 5% reserved for root.
		*st = unix.Statfs_t{Bsize: 4096, Frsize: 4096, Blocks: 1_000_000, Bfree: 300_000, Bavail: 250_000,
			Files: 500_000, Ffree: 420_000}
		return nil
	}
	got, err := FilesystemWith(fake, "/var/lib/mqlet")
	if err != nil {
		t.Fatal(err)
	}
	want := FsStats{Capacity: 4096 * 1_000_000, Available: 4096 * 250_000, Free: 4096 * 300_000, Inodes: 500_000, InodesFree: 420_000}
	if got != want {
		t.Errorf("FilesystemWith = %+v, want %+v", got, want)
	}
	// Counts are in fragment units, not in the preferred I/O size.
	frag := func(_ string, st *unix.Statfs_t) error {
		*st = unix.Statfs_t{Bsize: 65536, Frsize: 1024, Blocks: 10, Bavail: 4}
		return nil
	}
	if got, _ := FilesystemWith(frag, "x"); got.Capacity != 10240 || got.Available != 4096 {
		t.Errorf("fragment units: %+v, want capacity 10240 available 4096", got)
	}
	if _, err := FilesystemWith(fake, "/nowhere"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("statfs error: %v, want ENOENT", err)
	}
}

// The real statfs on a temp dir agrees with itself and with a file written there.
func TestFilesystemReal(t *testing.T) {
	dir := t.TempDir()
	st, err := Filesystem(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Capacity <= 0 || st.Available <= 0 || st.Available > st.Capacity || st.Free < st.Available {
		t.Errorf("Filesystem(%s) = %+v", dir, st)
	}
	if _, err := Filesystem(filepath.Join(dir, "absent")); err == nil {
		t.Errorf("Filesystem of a missing path: no error")
	}
	same, err := SameFilesystem(dir, filepath.Join(dir, "."))
	if err != nil || !same {
		t.Errorf("SameFilesystem(dir, dir) = %v, %v", same, err)
	}
	if same, err := SameFilesystem(dir, "/proc"); err != nil || same {
		t.Errorf("SameFilesystem(%s, /proc) = %v, %v; want false", dir, same, err)
	}
}

func TestDiskUsage(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "volumes", "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	// 1 MiB of real data (not a sparse file: du counts allocated blocks).
	if err := os.WriteFile(filepath.Join(dir, "volumes", "data", "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, n, err := DiskUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	// dir, volumes, data, f, hosts.
	if b < 1<<20 || b > 1<<20+64<<10 || n != 5 {
		t.Errorf("DiskUsage = %d bytes, %d inodes; want about 1 MiB and 5", b, n)
	}
	if b, n, err := DiskUsage(filepath.Join(dir, "gone")); err != nil || b != 0 || n != 0 {
		t.Errorf("DiskUsage of a missing dir = %d, %d, %v; want 0, 0, nil", b, n, err)
	}
}

// A mount below the dir (a pod's /dev/shm tmpfs) is not counted as the dir's disk use.
func TestDiskUsageSkipsMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	shm := filepath.Join(dir, "shm")
	os.Mkdir(shm, 0o755)
	if err := unix.Mount("tmpfs", shm, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(shm, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(shm, "fill"), make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	b, _, err := DiskUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b >= 4<<20 {
		t.Errorf("DiskUsage = %d bytes: counted the tmpfs mounted below", b)
	}
}
