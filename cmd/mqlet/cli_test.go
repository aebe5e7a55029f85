package main

// The command line's conventions: --version, exit 1 with a short error and a hint, and shell
// completion. In-process through run (what main calls), and as a real process where the exit
// status or a shell is what is tested.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/testenv"
)

// asMqletEnv makes the test binary run main (TestMain).
const asMqletEnv = "MQLET_TEST_AS_MQLET"

// TestMain: with MQLET_TEST_AS_MQLET=1 the test binary is mqlet itself (main), so CLI tests run
// the real process without building one.
func TestMain(m *testing.M) {
	if os.Getenv(asMqletEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// runCLI runs the command line args in-process as main does, and returns its exit status.
func runCLI(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status = run(args, &ctlEnv{ctx: ctx, in: strings.NewReader(""), out: &out, errOut: &errOut, now: time.Now})
	return status, out.String(), errOut.String()
}

// mqletProcess runs the test binary as mqlet (main, os.Exit and all) with args.
func mqletProcess(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asMqletEnv+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		status = ee.ExitCode()
	case err != nil:
		t.Fatalf("mqlet %v: %v", args, err)
	}
	return status, out.String(), errOut.String()
}

func TestVersionFlagAndCommand(t *testing.T) {
	want := "mqlet " + version + " (commit " + commit + ")\n"
	for _, args := range [][]string{{"--version"}, {"version"}, {"ctl", "get", "--version"}} {
		status, out, errOut := runCLI(t, args...)
		if status != 0 || out != want || errOut != "" {
			t.Errorf("mqlet %v = %d, %q, %q; want 0, %q", args, status, out, errOut, want)
		}
	}
	// The process, as a user runs it: exit 0, and the version a go test build has.
	status, out, _ := mqletProcess(t, "--version")
	if status != 0 || !strings.HasPrefix(out, "mqlet v0.0.0-dev") {
		t.Errorf("the process: mqlet --version = %d, %q", status, out)
	}
}

// A mistake on the command line is one error line and a hint naming the help to read, exit 1;
// the full usage is for --help.
func TestUsageErrorsAreShort(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string // the error line
		hint string
	}{
		{[]string{"--bogus"}, "mqlet: unknown flag --bogus", "Run 'mqlet --help' for usage."},
		{[]string{}, `mqlet: expected one of "agent",`, "Run 'mqlet --help' for usage."},
		{[]string{"ctl", "get", "nods"}, `mqlet: unexpected argument nods, did you mean one of "nodes", "pods"?`, "Run 'mqlet ctl get --help' for usage."},
		{[]string{"ctl", "get", "pods", "-o", "xml"}, `mqlet: --output must be one of "wide","json","yaml","" but got "xml"`, "Run 'mqlet ctl get pods --help' for usage."},
		{[]string{"completion", "tcsh"}, `mqlet: <shell> must be one of "bash","zsh","fish" but got "tcsh"`, "Run 'mqlet completion --help' for usage."},
		{[]string{"logs"}, "mqlet: expected \"<pod>\"", "Run 'mqlet logs --help' for usage."},
	} {
		status, out, errOut := runCLI(t, tc.args...)
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if status != 1 || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], tc.msg) || lines[1] != tc.hint {
			t.Errorf("mqlet %v = %d, stdout %q, stderr:\n%s\nwant 1, nothing on stdout, and on stderr %q... then %q", tc.args, status, out, errOut, tc.msg, tc.hint)
		}
	}
	// A command that fails (here: no broker) is one line too, without usage.
	status, _, errOut := runCLI(t, "ctl", "--broker", "tcp://127.0.0.1:1", "--timeout", "2s", "get", "nodes")
	if status != 1 || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "mqlet: ctl get nodes: ") {
		t.Errorf("a failing command = %d, %q; want 1 and one line", status, errOut)
	}
	// The process's status is 1, not kong's 80.
	if status, out, errOut := mqletProcess(t, "--bogus"); status != 1 || out != "" || strings.Count(errOut, "\n") != 2 {
		t.Errorf("the process: mqlet --bogus = %d, %q, %q; want 1 and two lines on stderr", status, out, errOut)
	}
	// --help is still the full usage, and a success.
	if status, out, _ := runCLI(t, "ctl", "get", "pods", "--help"); status != 0 || !strings.Contains(out, "--all-namespaces") {
		t.Errorf("ctl get pods --help = %d:\n%s", status, out)
	}
}

// completions runs `mqlet __complete words...` in-process and returns the candidates' words.
func completions(t *testing.T, words ...string) []string {
	t.Helper()
	status, out, errOut := runCLI(t, append([]string{"__complete"}, words...)...)
	if status != 0 {
		t.Fatalf("__complete %q = %d: %s", words, status, errOut)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		word, _, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("__complete %q: line %q has no tab", words, line)
		}
		got = append(got, word)
	}
	return got
}

func TestComplete(t *testing.T) {
	for _, tc := range []struct {
		words []string
		want  string // candidates joined by spaces
	}{
		{[]string{""}, "agent pods describe node logs exec top image version ctl check uninstall completion"}, // not the hidden ones
		{[]string{"c"}, "ctl check completion"},
		{[]string{"ctl", "get", ""}, "nodes pods"},
		{[]string{"ctl", "--broker", "tcp://b:1883", "g"}, "get"}, // the flag's value is skipped
		{[]string{"ctl", "--broker=tcp://b:1883", "get", "n"}, "nodes"},
		{[]string{"ctl", "get", "pods", "-o", ""}, "wide json yaml"},
		{[]string{"ctl", "get", "pods", "--output", "j"}, "json"},
		{[]string{"ctl", "get", "pods", "--output=y"}, "--output=yaml"},
		{[]string{"ctl", "get", "nodes", "-o", ""}, "json yaml"},
		{[]string{"image", "ls", "-o", ""}, "json"},
		{[]string{"pods", "--o"}, "--output"},
		{[]string{"ctl", "get", "pods", "--all"}, "--all-namespaces"},
		{[]string{"ctl", "--time"}, "--timeout"},               // a parent's flag
		{[]string{"ctl", "get", "pods", "--ver"}, "--version"}, // the root's flag everywhere
		{[]string{"completion", ""}, "bash zsh fish"},
		{[]string{"image", "import", ""}, ""}, // file names: left to the shell
		{[]string{"ctl", "--ca-file", ""}, ""},
		{[]string{"ctl", "get", "pods", "--", "-"}, ""}, // after --, nothing is a flag
		{[]string{"nothing-like-it", ""}, ""},
	} {
		if got := strings.Join(completions(t, tc.words...), " "); got != tc.want {
			t.Errorf("complete %q = %q, want %q", tc.words, got, tc.want)
		}
	}
}

// requireShell finds a shell, or fails with MQLET_TEST_REQUIRE=1 (scripts/testenv.sh installs
// zsh and fish) and skips without.
func requireShell(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(testenv.VarRequire) == "1" {
			t.Fatalf("%s is needed to test its completion script (scripts/testenv.sh installs it): %v", name, err)
		}
		t.Skipf("no %s: %v", name, err)
	}
	return path
}

// TestCompletionScripts completes command lines in the real shells with the scripts `mqlet
// completion` prints, the binary being this test binary run as mqlet (a link named mqlet on PATH).
func TestCompletionScripts(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(os.Args[0], filepath.Join(dir, "mqlet")); err != nil {
		t.Fatal(err)
	}
	script := func(shell string) string {
		status, out, errOut := runCLI(t, "completion", shell)
		if status != 0 {
			t.Fatalf("completion %s = %d: %s", shell, status, errOut)
		}
		file := filepath.Join(dir, "mqlet."+shell)
		if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	shell := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(requireShell(t, name), args...)
		cmd.Env = append(os.Environ(), asMqletEnv+"=1", "PATH="+dir+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %q: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	lines := []string{"mqlet ct", "mqlet ctl get ", "mqlet ctl get pods -o ", "mqlet ctl get pods --output=j", "mqlet completion "}

	t.Run("bash", func(t *testing.T) {
		// As readline calls it: COMP_LINE and COMP_POINT; COMP_WORDS split as bash splits them
		// (at "=" too), which the script must not be misled by.
		prog := ". " + script("bash") + "\n" + `for line in "$@"; do
    COMP_LINE=$line COMP_POINT=${#line}
    COMP_WORDS=(${line//=/ = }); [[ $line == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    _mqlet
    echo "$line|${COMPREPLY[*]}"
done`
		got := shell("bash", append([]string{"-c", prog, "bash"}, lines...)...)
		want := "mqlet ct|ctl\nmqlet ctl get |nodes pods\nmqlet ctl get pods -o |wide json yaml\n" +
			"mqlet ctl get pods --output=j|json\nmqlet completion |bash zsh fish\n"
		if got != want {
			t.Errorf("bash completions:\n%s\nwant:\n%s", got, want)
		}
	})
	t.Run("zsh", func(t *testing.T) {
		// The completion system stubbed: _describe prints what it is offered, _files says so.
		prog := `compdef() { :; }
_describe() { print -rl -- "${(@P)4}"; }
_files() { print -r -- "(files)"; }
. ` + script("zsh") + `
for line in "$@"; do
    words=("${(@s: :)line}")
    CURRENT=${#words}
    print -r -- "$line|$(_mqlet | tr '\n' ' ')"
done`
		got := shell("zsh", append([]string{"-f", "-c", prog, "zsh"}, "mqlet ct", "mqlet ctl get pods -o j", "mqlet image import f")...)
		want := "mqlet ct|ctl:Control plane over MQTT: apply to, read from and stream logs of nodes through the broker. \n" +
			"mqlet ctl get pods -o j|json:Output format: wide, json or yaml (default: a table). \n" +
			"mqlet image import f|(files) \n"
		if got != want {
			t.Errorf("zsh completions:\n%s\nwant:\n%s", got, want)
		}
	})
	t.Run("fish", func(t *testing.T) {
		prog := "source " + script("fish") + "\n" + `for line in $argv
    echo "$line|"(complete -C $line | string split -f1 \t | string join ' ')
end`
		got := shell("fish", append([]string{"-c", prog}, lines...)...)
		want := "mqlet ct|ctl\nmqlet ctl get |nodes pods\nmqlet ctl get pods -o |json wide yaml\n" +
			"mqlet ctl get pods --output=j|--output=json\nmqlet completion |bash fish zsh\n"
		if got != want {
			t.Errorf("fish completions:\n%s\nwant:\n%s", got, want)
		}
	})
}

func TestPrintImages(t *testing.T) {
	created := time.Date(2026, 11, 1, 12, 0, 0, 0, time.FixedZone("CET", 3600))
	imgs := []ctrd.ImageInfo{
		{Name: "docker.io/library/busybox:1.37", Digest: "sha256:0123456789abcdef0123456789abcdef", Size: 2_150_000, Created: created},
		{Name: "mqlet.test/app:1", Digest: "sha256:fedcba9876543210", Size: 999, Created: created},
	}
	var out bytes.Buffer
	if err := printImages(&out, imgs, false, outputJSON); err != nil {
		t.Fatal(err)
	}
	var got imageListJSON
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("-o json: %v", err)
	}
	if len(got.Images) != 2 || got.Images[0].Name != imgs[0].Name || got.Images[0].Digest != imgs[0].Digest ||
		got.Images[0].Size != 2_150_000 || !got.Images[0].Created.Equal(created) || got.Images[1].Size != 999 {
		t.Errorf("-o json = %+v", got)
	}
	out.Reset()
	if err := printImages(&out, nil, false, outputJSON); err != nil || out.String() != "{\n    \"images\": []\n}\n" {
		t.Errorf("-o json of no images = %q, %v; want an empty list", out.String(), err)
	}
	out.Reset()
	if err := printImages(&out, imgs, false, outputTable); err != nil ||
		!strings.Contains(out.String(), "docker.io/library/busybox:1.37  sha256:0123456789ab  2.15 MB  2026-11-01T11:00:00Z") {
		t.Errorf("table:\n%s", out.String())
	}
	if status, _, errOut := runCLI(t, "image", "ls", "-q", "-o", "json"); status != 1 || !strings.Contains(errOut, "-q and -o json exclude each other") {
		t.Errorf("image ls -q -o json = %d, %q", status, errOut)
	}
}

// `make build` and `make cross` stamp the version into the variables main reads: a rename on
// either side would leave released binaries at v0.0.0-dev without any build failing.
func TestMakefileStampsTheVersion(t *testing.T) {
	_, _ = stampedVersion, stampedCommit // the names the Makefile must use
	for _, args := range [][]string{{"VERSION=v1.2.3", "COMMIT=abc"}, {}} {
		cmd := exec.Command("make", append([]string{"-s", "-n", "-C", "../..", "build", "cross"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n build cross %v: %v\n%s", args, err, out)
		}
		builds := 0
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.Contains(line, "go build") {
				continue
			}
			builds++
			want := `-X main.stampedVersion=v1.2.3 -X main.stampedCommit=abc"`
			if len(args) == 0 { // make's own: scripts/version.sh's semver and the commit
				want = "-X main.stampedVersion=v"
			}
			if !strings.Contains(line, want) {
				t.Errorf("make %v builds without %q:\n%s", args, want, line)
			}
		}
		if builds != 6 { // build: mqlet, mqlet-bridge and mqlet-fleetsim; cross: three mqlet
			t.Errorf("make -n build cross %v ran %d go builds, want 6:\n%s", args, builds, out)
		}
	}
}
