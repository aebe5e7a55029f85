package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// writeFile writes by rename, as careful tools do, so a watcher never reads it half-written (an
// empty file is now a problem of its own: see TestScanEmptyFileKeepsPods).
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".writing")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func scan(t *testing.T, d *Dir) Snapshot {
	t.Helper()
	s, err := d.Scan()
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return s
}

// podNames lists the snapshot's pods as "name=image" (first container), with "(stale)" marks.
func podNames(s Snapshot) string {
	var out []string
	for _, p := range s.Pods {
		n := p.Pod.Name + "=" + p.Pod.Spec.Containers[0].Image
		if p.Stale {
			n += "(stale)"
		}
		out = append(out, n)
	}
	return strings.Join(out, " ")
}

func problemText(s Snapshot) string {
	var out []string
	for _, p := range s.Problems {
		out = append(out, p.Error())
	}
	return strings.Join(out, "\n")
}

func TestScanMissingDirectory(t *testing.T) {
	d := NewDir(filepath.Join(t.TempDir(), "not-yet"))
	s, err := d.Scan()
	if err != nil || len(s.Pods) != 0 || len(s.Problems) != 0 {
		t.Fatalf("Scan of a missing dir = %v, %v; want empty and no error", s, err)
	}
}

func TestScanNotADirectory(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	writeFile(t, f, "x")
	if _, err := NewDir(f).Scan(); err == nil || !strings.Contains(err.Error(), f) {
		t.Fatalf("Scan of a regular file: err = %v, want an error naming %s", err, f)
	}
}

func TestScanSortedAndFiltered(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("zeta", "img:1")+"---\n"+podYAML("alpha", "img:1"))
	writeFile(t, filepath.Join(dir, "c.yml"), podYAML("mid", "img:1"))
	writeFile(t, filepath.Join(dir, "d.json"), `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"json"},"spec":{"containers":[{"name":"c","image":"img:1"}]}}`)
	for _, ignored := range []string{".hidden.yaml", "e.yaml~", "e.yaml.swp", "e.yaml.tmp", "notes.txt", "README"} {
		writeFile(t, filepath.Join(dir, ignored), "this is not yaml: [")
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "elsewhere.txt")
	writeFile(t, target, podYAML("linked", "img:1"))
	if err := os.Symlink(target, filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}

	d := NewDir(dir)
	s := scan(t, d)
	if got, want := podNames(s), "alpha=img:1 json=img:1 linked=img:1 mid=img:1 zeta=img:1"; got != want {
		t.Errorf("pods = %q, want %q", got, want)
	}
	if len(s.Problems) != 0 {
		t.Errorf("unexpected problems:\n%s", problemText(s))
	}
	if f := s.Pods[2].File; f != filepath.Join(dir, "link.yaml") {
		t.Errorf("symlinked pod File = %q, want the link's path", f)
	}
}

func TestScanInvalidFileKeepsPreviousPods(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	d := NewDir(dir)

	writeFile(t, file, podYAML("web", "nginx:1")+"---\n"+podYAML("db", "pg:1"))
	s := scan(t, d)
	if got := podNames(s); got != "db=pg:1 web=nginx:1" {
		t.Fatalf("first scan pods = %q", got)
	}
	webUID := s.Pods[1].Pod.UID

	// The whole file turns to garbage: nothing it declared goes away.
	writeFile(t, file, "apiVersion: v1\nkind: Pod\nmetadata: [\n")
	s = scan(t, d)
	if got := podNames(s); got != "db=pg:1(stale) web=nginx:1(stale)" {
		t.Errorf("after garbage pods = %q, want both kept as stale", got)
	}
	if len(s.Problems) != 1 || s.Problems[0].File != file || s.Problems[0].Index != 0 {
		t.Errorf("after garbage problems:\n%s", problemText(s))
	}

	// web is edited validly while db is broken: web takes the edit, db stays as it was.
	writeFile(t, file, podYAML("web", "nginx:2")+"---\n"+strings.Replace(podYAML("db", "pg:2"), "image:", "imagee:", 1))
	s = scan(t, d)
	if got := podNames(s); got != "db=pg:1(stale) web=nginx:2" {
		t.Errorf("after partial fix pods = %q", got)
	}
	if s.Pods[1].Pod.UID != webUID {
		t.Errorf("web's UID changed across an edit: %s -> %s", webUID, s.Pods[1].Pod.UID)
	}
	if len(s.Problems) != 1 || s.Problems[0].Index != 1 || !strings.Contains(s.Problems[0].Error(), "imagee") {
		t.Errorf("after partial fix problems:\n%s", problemText(s))
	}

	// The file is clean again and no longer declares db: db goes away.
	writeFile(t, file, podYAML("web", "nginx:2"))
	s = scan(t, d)
	if got := podNames(s); got != "web=nginx:2" || len(s.Problems) != 0 {
		t.Errorf("after clean edit pods = %q, problems:\n%s", got, problemText(s))
	}

	// Too large is a problem with the whole file; the pods stay.
	writeFile(t, file, podYAML("web", "nginx:2")+"# "+strings.Repeat("x", MaxFileSize)+"\n")
	s = scan(t, d)
	if got := podNames(s); got != "web=nginx:2(stale)" {
		t.Errorf("after oversize pods = %q", got)
	}
	if len(s.Problems) != 1 || s.Problems[0].Index != -1 || !strings.Contains(s.Problems[0].Error(), "limit") {
		t.Errorf("after oversize problems:\n%s", problemText(s))
	}
}

func TestScanFileDeletionRemovesPods(t *testing.T) {
	dir := t.TempDir()
	d := NewDir(dir)
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "img"))
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("b", "img"))
	if got := podNames(scan(t, d)); got != "a=img b=img" {
		t.Fatalf("pods = %q", got)
	}
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if got := podNames(scan(t, d)); got != "b=img" {
		t.Errorf("after deleting a.yaml pods = %q, want b only", got)
	}
	// A file that had problems and then is deleted also loses its kept pods.
	writeFile(t, filepath.Join(dir, "b.yaml"), "garbage: [")
	if got := podNames(scan(t, d)); got != "b=img(stale)" {
		t.Fatalf("pods = %q", got)
	}
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if s := scan(t, d); len(s.Pods) != 0 || len(s.Problems) != 0 {
		t.Errorf("after deleting everything: pods %q problems:\n%s", podNames(s), problemText(s))
	}
}

func TestScanDuplicatesAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	d := NewDir(dir)
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("web", "from-b"))
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("other", "x")+"---\n"+podYAML("web", "from-a"))
	s := scan(t, d)
	if got := podNames(s); got != "other=x web=from-a" {
		t.Errorf("pods = %q, want a.yaml's web to win", got)
	}
	want := "manifest " + filepath.Join(dir, "b.yaml") + ", document 0 (line 1): pod default/web is already declared in " + filepath.Join(dir, "a.yaml") + ", document 1"
	if len(s.Problems) != 1 || !strings.HasPrefix(s.Problems[0].Error(), want) {
		t.Errorf("problems:\n%s\nwant one starting %q", problemText(s), want)
	}
	// Once a.yaml drops web, b.yaml's web takes over.
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("other", "x"))
	if s := scan(t, d); podNames(s) != "other=x web=from-b" || len(s.Problems) != 0 {
		t.Errorf("after a.yaml dropped web: pods %q problems:\n%s", podNames(s), problemText(s))
	}
}

func TestScanSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	d := NewDir(dir)
	if err := os.Symlink(filepath.Join(dir, "missing-target"), filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := scan(t, d) // must not block on the FIFO
	text := problemText(s)
	if len(s.Problems) != 2 || !strings.Contains(text, "dangling.yaml: symlink target") || !strings.Contains(text, "fifo.yaml: not a regular file") {
		t.Errorf("problems:\n%s", text)
	}
}

func TestScanReturnsCopies(t *testing.T) {
	dir := t.TempDir()
	d := NewDir(dir)
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "img"))
	s := scan(t, d)
	s.Pods[0].Pod.Spec.Containers[0].Image = "changed-by-caller"
	writeFile(t, filepath.Join(dir, "a.yaml"), "broken: [")
	if got := podNames(scan(t, d)); got != "a=img(stale)" {
		t.Errorf("kept pod = %q: the caller's change leaked into the Dir's memory", got)
	}
}

// A file truncated to nothing (power loss mid-save) or left with only comments must not delete
// its pods: it is reported, and its pods are kept, like an unreadable file's.
func TestScanEmptyFileKeepsPods(t *testing.T) {
	for name, empty := range map[string]string{"zero bytes": "", "blank": "\n  \n", "comments": "# nothing yet\n---\n# still nothing\n"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "a.yaml")
			d := NewDir(dir)
			writeFile(t, file, podYAML("web", "nginx:1"))
			scan(t, d)
			writeFile(t, file, empty)
			s := scan(t, d)
			if got := podNames(s); got != "web=nginx:1(stale)" {
				t.Errorf("after truncation pods = %q, want web kept", got)
			}
			if len(s.Problems) != 1 || !s.Problems[0].Empty || !strings.Contains(s.Problems[0].Error(), "empty") {
				t.Fatalf("problems:\n%s", problemText(s))
			}
			c := s.Change()
			if len(c.Rejections) != 1 || !c.Rejections[0].Keep || c.Rejections[0].Ref.Origin != file {
				t.Errorf("rejections %+v: want one that keeps %s", c.Rejections, file)
			}
		})
	}
}
