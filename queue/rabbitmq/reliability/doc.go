// Package reliability holds the RabbitMQ queue's reliability proofs
// against a real broker (tests only): the crash test (SIGKILLed worker
// processes and broker restarts), delays on time without head-of-line
// blocking, and a poison message's way to the DLQ. The worker processes
// are this package's test binary, run again in a worker role.
package reliability
