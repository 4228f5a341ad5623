// Command coredns: CoreDNS with only the plugins the testbed needs.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order plugins run in (dnsserver's full list names plugins that are
// not compiled in; caddy only needs the ones a Corefile uses to be known).
func init() {
	dnsserver.Directives = []string{"bind", "errors", "log", "health", "ready", "hosts", "kubernetes"}
}

func main() { coremain.Run() }
