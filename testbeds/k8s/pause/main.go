// Command pause: the sandbox ("pause") container of the testbed's real node.
//
// Nothing can be pulled here, so the pod sandbox image is built locally from
// this file: it holds the pod's namespaces open until SIGTERM/SIGINT and,
// as PID 1 of a shared PID namespace, reaps orphans like the upstream pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
