// A plain closed-loop CoAP load generator written the idiomatic Go way, as the baseline
// that `cobalt bench` is measured against (bench/generator-compare.sh): one goroutine
// per client, each with its own connected UDP socket, sending a confirmable GET to one
// URI path and waiting for the answer before sending the next. Only 2.xx answers that
// match the request's message ID and token count; a request unanswered within -timeout
// is lost and the client moves on. Standard library only.
//
// Usage: go run . -addr 127.0.0.1:5683 -path benchmark -c 100 -d 10s -warmup 1s
// It prints one line: "<requests per second> req/s (<completed> completed, <lost> lost,
// <other> other answers in <seconds> s)".
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// request encodes a CON GET with message ID mid, an 8-byte token and one Uri-Path
// option per segment of path.
func request(mid uint16, token uint64, path []string) []byte {
	b := make([]byte, 0, 64)
	b = append(b, 0x48, 0x01, byte(mid>>8), byte(mid)) // v1, CON, TKL 8, GET
	b = binary.BigEndian.AppendUint64(b, token)
	prev := 0
	for _, seg := range path {
		delta, n := 11-prev, len(seg)
		prev = 11
		b = appendOption(b, delta, n)
		b = append(b, seg...)
	}
	return b
}

// appendOption writes an option header with the given delta and length (RFC 7252 §3.1).
func appendOption(b []byte, delta, n int) []byte {
	nib := func(v int) (byte, []byte) {
		switch {
		case v < 13:
			return byte(v), nil
		case v < 269:
			return 13, []byte{byte(v - 13)}
		default:
			return 14, []byte{byte((v - 269) >> 8), byte(v - 269)}
		}
	}
	d, dx := nib(delta)
	l, lx := nib(n)
	b = append(b, d<<4|l)
	b = append(b, dx...)
	return append(b, lx...)
}

// answer tells whether d is the piggybacked ACK for (mid, token), and its code.
func answer(d []byte, mid uint16, token uint64) (code byte, ok bool) {
	if len(d) < 12 || d[0]>>6 != 1 || d[0]&0x0f != 8 || (d[0]>>4)&3 != 2 {
		return 0, false
	}
	if binary.BigEndian.Uint16(d[2:4]) != mid || binary.BigEndian.Uint64(d[4:12]) != token {
		return 0, false
	}
	return d[1], true
}

func main() {
	addr := flag.String("addr", "127.0.0.1:5683", "server address")
	path := flag.String("path", "benchmark", "URI path")
	clients := flag.Int("c", 100, "clients (goroutines, one UDP socket each)")
	duration := flag.Duration("d", 10*time.Second, "measured duration")
	warmup := flag.Duration("warmup", time.Second, "warm-up before the measurement")
	timeout := flag.Duration("timeout", 2*time.Second, "a request unanswered this long is lost")
	flag.Parse()
	var segs []string
	for _, s := range strings.Split(*path, "/") {
		if s != "" {
			segs = append(segs, s)
		}
	}
	raddr, err := net.ResolveUDPAddr("udp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-generator:", err)
		os.Exit(2)
	}
	var completed, lost, other atomic.Uint64
	var measuring, done atomic.Bool
	for i := 0; i < *clients; i++ {
		conn, err := net.DialUDP("udp", nil, raddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go-generator:", err)
			os.Exit(1)
		}
		go func(conn *net.UDPConn, seed int64) {
			defer conn.Close()
			rng := rand.New(rand.NewSource(seed))
			mid := uint16(rng.Uint32())
			buf := make([]byte, 2048)
			for !done.Load() {
				mid++
				token := rng.Uint64()
				if _, err := conn.Write(request(mid, token, segs)); err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				deadline := time.Now().Add(*timeout)
				_ = conn.SetReadDeadline(deadline)
				for {
					n, err := conn.Read(buf)
					if err != nil {
						var ne net.Error
						if errors.As(err, &ne) && ne.Timeout() && measuring.Load() {
							lost.Add(1)
						}
						break
					}
					code, ok := answer(buf[:n], mid, token)
					if !ok {
						continue // stray or duplicate
					}
					if measuring.Load() {
						if code>>5 == 2 {
							completed.Add(1)
						} else {
							other.Add(1)
						}
					}
					break
				}
			}
		}(conn, int64(i)*7919+time.Now().UnixNano())
	}
	time.Sleep(*warmup)
	measuring.Store(true)
	start := time.Now()
	time.Sleep(*duration)
	measuring.Store(false)
	secs := time.Since(start).Seconds()
	n := completed.Load()
	done.Store(true)
	fmt.Printf("%.0f req/s (%d completed, %d lost, %d other answers in %.2f s)\n",
		float64(n)/secs, n, lost.Load(), other.Load(), secs)
	os.Exit(0)
}
