//go:build !linux

package mqtttest

import "syscall"

// sysProcAttr: without Linux's parent-death signal the harness relies on its
// t.Cleanup alone.
func sysProcAttr() *syscall.SysProcAttr { return nil }
