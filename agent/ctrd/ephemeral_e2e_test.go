package ctrd_test

import (
	"context"
	"errors"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

// An ephemeral container with a targetContainerName joins the PID namespace of the target's running
// task (and the pod's network namespace, like any container); one without a target has a PID
// namespace of its own; while the target runs no task the start is CreateContainerConfigError.
func TestEphemeralContainerTargetPIDNamespace(t *testing.T) {
	g := newRig(t)
	p := newPod("6a0c0009-eph", shell("app", "exec sleep 3602"))
	debug := func(name, target string) v1.Container {
		ec := v1.EphemeralContainer{TargetContainerName: target, EphemeralContainerCommon: v1.EphemeralContainerCommon{
			Name: name, Image: testenv.BusyboxRef, ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"}}}
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, ec)
		return v1.Container(ec.EphemeralContainerCommon)
	}
	targeted, alone := debug("targeted", "app"), debug("alone", "")
	sb := g.sandbox(p)

	_, err := g.r.StartContainer(context.Background(), p, sb, &targeted, 0)
	var se *ctrd.StartError
	if !errors.As(err, &se) || se.Reason != "CreateContainerConfigError" {
		t.Fatalf("start with the target not running: %v; want a CreateContainerConfigError", err)
	}

	app := g.start(p, sb, &p.Spec.Containers[0])
	tc := g.start(p, sb, &targeted)
	ac := g.start(p, sb, &alone)
	if a, d := nsOf(t, app.Pid, "pid"), nsOf(t, tc.Pid, "pid"); a != d {
		t.Errorf("pid namespace: app %s, targeted ephemeral container %s; want the same", a, d)
	}
	if a, d := nsOf(t, app.Pid, "pid"), nsOf(t, ac.Pid, "pid"); a == d || d == nsOf(t, 0, "pid") {
		t.Errorf("pid namespace: app %s, untargeted ephemeral container %s, host %s; want one of its own", a, d, nsOf(t, 0, "pid"))
	}
	for _, c := range []ctrd.Container{tc, ac} {
		if a, d := nsOf(t, app.Pid, "net"), nsOf(t, c.Pid, "net"); a != d {
			t.Errorf("network namespace: app %s, %s %s; want the pod's", a, c.Name, d)
		}
	}
}
