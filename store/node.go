package store

import (
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
)

// keyNode is the one key of node_status: a state file belongs to one node.
var keyNode = []byte("node")

func encodeNode(n *v1.Node) ([]byte, error) {
	if n == nil {
		return nil, errors.New("nil node")
	}
	if n.Name == "" {
		return nil, errors.New("node has no metadata.name")
	}
	b, err := json.Marshal(n)
	if err != nil {
		return nil, fmt.Errorf("encode node %s: %w", n.Name, err)
	}
	return b, nil
}

// decodeNode decodes the node_status record; the error is a RecordError.
func decodeNode(val []byte) (*v1.Node, error) {
	n := new(v1.Node)
	if err := json.Unmarshal(val, n); err != nil {
		return nil, RecordError{Bucket: string(bucketNodeStatus), Key: string(keyNode), Err: err}
	}
	if n.Name == "" {
		return nil, RecordError{Bucket: string(bucketNodeStatus), Key: string(keyNode), Err: errors.New("node has no metadata.name")}
	}
	return n, nil
}

// PutNodeStatus stores the node's status, replacing the previous one. The caller writes it on a
// real change only (nodestatus.Manager), so an idle node costs no fsync.
func (d *DB) PutNodeStatus(n *v1.Node) error {
	val, err := encodeNode(n)
	if err != nil {
		return fmt.Errorf("state db %s: put node status: %w", d.path, err)
	}
	err = d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketNodeStatus)
		if err != nil {
			return err
		}
		return b.Put(keyNode, val)
	})
	if err != nil {
		return fmt.Errorf("state db %s: put node status of %s: %w", d.path, n.Name, err)
	}
	return nil
}

// GetNodeStatus returns the stored node status, and false if there is none. A record that cannot
// be decoded is an error (a RecordError, wrapped).
func (d *DB) GetNodeStatus() (*v1.Node, bool, error) {
	var n *v1.Node
	err := d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketNodeStatus)
		if err != nil {
			return err
		}
		val := b.Get(keyNode)
		if val == nil {
			return nil
		}
		n, err = decodeNode(val)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("state db %s: get node status: %w", d.path, err)
	}
	return n, n != nil, nil
}

// PutNodeStatus is DB.PutNodeStatus in memory.
func (m *Memory) PutNodeStatus(n *v1.Node) error {
	val, err := encodeNode(n)
	if err != nil {
		return fmt.Errorf("memory state: put node status: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketNodeStatus)
	if err != nil {
		return fmt.Errorf("memory state: put node status of %s: %w", n.Name, err)
	}
	b[string(keyNode)] = val
	return nil
}

// GetNodeStatus is DB.GetNodeStatus in memory.
func (m *Memory) GetNodeStatus() (*v1.Node, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketNodeStatus)
	if err != nil {
		return nil, false, fmt.Errorf("memory state: get node status: %w", err)
	}
	val, ok := b[string(keyNode)]
	if !ok {
		return nil, false, nil
	}
	n, err := decodeNode(val)
	if err != nil {
		return nil, false, fmt.Errorf("memory state: get node status: %w", err)
	}
	return n, true, nil
}
