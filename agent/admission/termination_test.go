package admission

import (
	"strings"
	"testing"
)

func TestTerminationMessageFields(t *testing.T) {
	p := parseOne(t, "/m/p.yaml", podYAML("web", "nginx"))
	if c := p.Spec.Containers[0]; c.TerminationMessagePath != "/dev/termination-log" || c.TerminationMessagePolicy != "File" {
		t.Errorf("defaults: %q %q", c.TerminationMessagePath, c.TerminationMessagePolicy)
	}
	for field, want := range map[string]string{
		"terminationMessagePath: relative/msg":            `spec.containers[0].terminationMessagePath: Invalid value: "relative/msg": must be an absolute path`,
		"terminationMessagePath: /":                       `spec.containers[0].terminationMessagePath: Invalid value: "/"`,
		"terminationMessagePolicy: Sometimes":             `spec.containers[0].terminationMessagePolicy: Unsupported value: "Sometimes"`,
		"terminationMessagePolicy: FallbackToLogsOnError": "",
	} {
		data := podYAML("web", "nginx") + "    " + field + "\n"
		_, err := admit("/m/p.yaml", data)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: refused: %v", field, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want %q", field, err, want)
		}
	}
}
