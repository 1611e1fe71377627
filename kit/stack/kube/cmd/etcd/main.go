// Command etcd is the upstream etcd server: go.etcd.io/etcd/server/v3's own main calls
// etcdmain.Main, which this module cannot build directly (it is a package main of another
// module), so this one-line main does the same.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
