// Command pause is the pod sandbox of the test node (internal/testenv): it
// holds the pod's namespaces, reaps the zombies of processes whose parent
// died, and exits on SIGTERM or SIGINT. It does what the upstream pause
// image does, in Go, so that the test node needs no image from a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
