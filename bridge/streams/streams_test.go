package streams

import "testing"

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want target
		bad  bool
	}{
		{path: "/exec/ns/pod/c", want: target{verb: "exec", namespace: "ns", pod: "pod", container: "c"}},
		{path: "/exec/ns/pod/uid-1/c", want: target{verb: "exec", namespace: "ns", pod: "pod", uid: "uid-1", container: "c"}},
		{path: "/attach/ns/pod/c", want: target{verb: "attach", namespace: "ns", pod: "pod", container: "c"}},
		{path: "/run/ns/pod/c", want: target{verb: "run", namespace: "ns", pod: "pod", container: "c"}},
		{path: "/portForward/ns/pod", want: target{verb: "portForward", namespace: "ns", pod: "pod"}},
		{path: "/portForward/ns/pod/uid-1", want: target{verb: "portForward", namespace: "ns", pod: "pod", uid: "uid-1"}},
		{path: "/exec/ns/pod", bad: true},
		{path: "/portForward/ns", bad: true},
		{path: "/exec/ns/pod/a/b/c", bad: true},
		{path: "/stats/summary", bad: true},
	} {
		got, err := parsePath(tc.path)
		if tc.bad {
			if err == nil {
				t.Errorf("%s: parsed as %+v, want an error", tc.path, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.path, got, err, tc.want)
		}
	}
}

func TestRunOutputIsBounded(t *testing.T) {
	var w syncWriter
	chunk := make([]byte, 1<<20)
	for range 6 {
		if n, err := w.Write(chunk); n != len(chunk) || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	if len(w.bytes()) != runOutputLimit {
		t.Errorf("kept %d bytes, want %d", len(w.bytes()), runOutputLimit)
	}
}
