package e2e

// A TCP forwarder that gives kube-apiserver one address for the whole test: the test server
// picks a fresh port on every start, and a restart must look to clients like the same server
// going away and coming back. TLS passes through untouched.

import (
	"io"
	"net"
	"sync"
	"testing"
)

type apiProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string // "" while the apiserver is down: connections are closed at once
	conns  map[net.Conn]struct{}
}

func newAPIProxy(t *testing.T) *apiProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.retarget("")
	})
	return p
}

func (p *apiProxy) addr() string { return p.ln.Addr().String() }

// retarget points new connections at target and closes every forwarded connection, as a
// stopped server would.
func (p *apiProxy) retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

func (p *apiProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(client)
	}
}

func (p *apiProxy) forward(client net.Conn) {
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	if target == "" {
		client.Close()
		return
	}
	server, err := net.Dial("tcp", target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if p.target != target {
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(server, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}
