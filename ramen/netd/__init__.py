"""`ramen netd`: a host's network daemon (Aeron's media driver role). It sends local logs over UDP
and rebuilds the streams other hosts send as local image logs, as the confserver's
`sites/<site>/net/...` keys ask, with the agents of ramen.transport.udp."""
