package e2e

// A component run as a child process (the extender, kube-scheduler): its output goes to a log
// file, SIGKILL ends it (a crash, not a shutdown), and the test's cleanup kills it, keeps its log
// (DNE_E2E_LOGS) and prints the log's tail when the test failed.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

type childProc struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

// startChild starts cmd with its output in logPath; what names it in the failure log.
func startChild(t *testing.T, what string, cmd *exec.Cmd, logPath string, tailLines int) *childProc {
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	c := &childProc{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.kill()
		keepLog(t, logPath)
		if t.Failed() {
			t.Logf("%s log %s (tail):\n%s", what, logPath, tail(logPath, tailLines))
		}
	})
	return c
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *childProc) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

func (c *childProc) pid() int { return c.cmd.Process.Pid }

// keepLog copies a component's log to $DNE_E2E_LOGS (when set) before the test's temp dir goes.
func keepLog(t *testing.T, path string) {
	dir := os.Getenv("DNE_E2E_LOGS")
	if dir == "" {
		return
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return
	}
	_ = os.MkdirAll(dir, 0o755)
	name := strings.ReplaceAll(t.Name(), "/", "_") + "-" + filepath.Base(path)
	_ = os.WriteFile(filepath.Join(dir, name), raw, 0o644)
}

func tail(path string, lines int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// parallelFor runs f(0..n-1) on `workers` goroutines and returns when all are done.
func parallelFor(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := int64(-1)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := atomic.AddInt64(&next, 1)
				if i >= int64(n) {
					return
				}
				f(int(i))
			}
		}()
	}
	wg.Wait()
}
