package ctrd_test

import (
	"bytes"
	"context"

	"github.com/mqlet/mqlet/core/logs"
)

// readLog is a container's output as `mqlet logs` shows it (the file holds CRI records).
func readLog(path string) ([]byte, error) {
	var b bytes.Buffer
	err := logs.Read(context.Background(), path, logs.ReadOptions{Tail: logs.All}, &b)
	return b.Bytes(), err
}
