package ctrd

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary stand in for the mqlet binary as a shared PID namespace's holder:
// tests give the runtime their own executable, and it runs it with PauseCommand.
func TestMain(m *testing.M) {
	if len(os.Args) == 2 && os.Args[1] == PauseCommand {
		err := RunPause()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// testExecutable is the test binary, for Options.Executable.
func testExecutable(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}
