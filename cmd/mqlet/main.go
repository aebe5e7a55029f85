package main

import (
	_ "github.com/alecthomas/kong"
	_ "github.com/containerd/containerd"
	_ "github.com/fsnotify/fsnotify"
	_ "go.etcd.io/bbolt"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/util/yaml"
	_ "sigs.k8s.io/yaml"
)

func main() {}
