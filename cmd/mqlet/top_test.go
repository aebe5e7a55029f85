package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/usage"
)

// kubectl top's columns: the node's millicores and share of its CPUs, working set in MiB and share
// of MemTotal; pods summed over their containers, or one line per container; -n filters.
func TestPrintTop(t *testing.T) {
	r := usage.Rate{
		Node: usage.NodeRate{MilliCPU: 1500, CPUs: 4, MemoryWorkingSetBytes: 1 << 30, MemoryCapacityBytes: 4 << 30},
		Containers: []usage.ContainerRate{
			{Namespace: "default", Pod: "web", Container: "app", MilliCPU: 250, MemoryWorkingSetBytes: 30 << 20},
			{Namespace: "default", Pod: "web", Container: "sidecar", MilliCPU: 5, MemoryWorkingSetBytes: 2 << 20},
			{Namespace: "tools", Pod: "job", Container: "run", MilliCPU: 0, MemoryWorkingSetBytes: 1 << 19},
		},
	}
	var b bytes.Buffer
	if err := printTop(&b, "pi", r, "", false); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"NODE CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)",
		"pi 1500m 37% 1024Mi 25%",
		"NAMESPACE NAME CPU(cores) MEMORY(bytes)",
		"default web 255m 32Mi",
		"tools job 0m 0Mi",
	}
	if got := squash(b.String()); !equalLines(got, want) {
		t.Errorf("mqlet top:\n%s\nwant (spaces squashed):\n%s", b.String(), strings.Join(want, "\n"))
	}
	b.Reset()
	if err := printTop(&b, "pi", r, "default", true); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"NODE CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)",
		"pi 1500m 37% 1024Mi 25%",
		"NAMESPACE POD NAME CPU(cores) MEMORY(bytes)",
		"default web app 250m 30Mi",
		"default web sidecar 5m 2Mi",
	}
	if got := squash(b.String()); !equalLines(got, want) {
		t.Errorf("mqlet top --containers -n default:\n%s\nwant (spaces squashed):\n%s", b.String(), strings.Join(want, "\n"))
	}
}

func squash(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}

func equalLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
