// Command etcd: the etcd server's main package, built in the testbed's one Go
// build beside Kubernetes (build.sh), whose module graph already holds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
