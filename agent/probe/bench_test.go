package probe

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The server runs in another process (busybox httpd, as in the bench), so the CPU per op is the
// prober's alone.
func benchProbe(b *testing.B, inNS bool, handler func(port int) *v1.ProbeHandler) {
	var tg Target
	port := 18080
	args := []string{"httpd", "-f", "-p", "127.0.0.1:" + strconv.Itoa(port), "-h", b.TempDir()}
	cmd := exec.Command("busybox", args...)
	if inNS {
		ns := testNetNS(b)
		cmd = exec.Command("nsenter", append([]string{"--net=" + ns, "busybox"}, args...)...)
		f, err := os.Open(ns)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		tg = Target{Pod: &v1.Pod{}, Container: &v1.Container{Name: "c"}, NetNS: ns, ns: f}
	} else {
		tg = hostTarget()
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(300 * time.Millisecond)
	tg.cache = &cache{}
	h := handler(port)
	p := NewProber()
	var r0, r1 syscall.Rusage
	b.ReportAllocs()
	b.ResetTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	for i := 0; i < b.N; i++ {
		if res, out, err := p.Run(context.Background(), tg, h, time.Second); res == Unknown || err != nil {
			b.Fatal(res, out, err)
		}
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano()
	b.ReportMetric(float64(cpu)/float64(b.N)/1000, "cpu-us/op")
}

func httpHandler(port int) *v1.ProbeHandler {
	return &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(int32(port))}}
}
func tcpHandler(port int) *v1.ProbeHandler {
	return &v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}
}

func BenchmarkHTTPGetHost(b *testing.B)  { benchProbe(b, false, httpHandler) }
func BenchmarkHTTPGetNetNS(b *testing.B) { benchProbe(b, true, httpHandler) }
func BenchmarkTCPHost(b *testing.B)      { benchProbe(b, false, tcpHandler) }
func BenchmarkTCPNetNS(b *testing.B)     { benchProbe(b, true, tcpHandler) }

var _ = fmt.Sprint
var _ = net.IPv4len
var _ = http.StatusOK
