package policy

// classify maps a failure to its class. The most specific signal wins: an
// HTTP status, then a gRPC code, then an error kind, then the default.
func (p *Policy) classify(f *Failure) Class {
	if f.HTTPStatus != 0 {
		if c := p.http[f.HTTPStatus]; c != 0 {
			return Class(c - 1)
		}
	}
	if f.GRPCCode != 0 {
		if c := p.grpc[f.GRPCCode]; c != 0 {
			return Class(c - 1)
		}
	}
	if f.ErrorKind != "" {
		if c, ok := p.kinds[f.ErrorKind]; ok {
			return c
		}
	}
	return p.defaultClass
}
