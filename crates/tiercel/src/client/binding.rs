//! Making a binding: through shared memory on this host, over UDP, or over TCP where UDP gets no
//! answer, as the address and the configuration ask.

use super::*;

impl Binding {
    pub(super) fn bind(
        server: SocketAddr,
        transport: Option<Transport>,
        info: &'static InterfaceInfo,
        config: ClientConfig,
    ) -> Result<Binding, BindError> {
        let try_shm = match transport {
            Some(Transport::SharedMemory) => true,
            Some(Transport::Udp) => false,
            Some(Transport::Tcp) => return Self::bind_tcp(server, info, config),
            Some(Transport::Xdp) => return Self::bind_xdp(server, info, config),
            None => config.shared_memory,
        };
        // A client that expects the server's key falls back to TCP secure too.
        let fallback = config.tcp_fallback;
        if !try_shm {
            return match Self::bind_udp(server, info, config.clone()) {
                Err(BindError::Unreachable(_)) if transport.is_none() && fallback => {
                    Self::fall_back_to_tcp(server, info, config)
                }
                bound => bound,
            };
        }
        // Ask the server where to bind through shared memory; a server elsewhere (or without it)
        // answers with a binding over UDP.
        let forced = transport == Some(Transport::SharedMemory);
        let asked = match udp_bind::bind_udp(server, info, &config, true) {
            Err(BindError::Unreachable(_)) if !forced && fallback => {
                return Self::fall_back_to_tcp(server, info, config)
            }
            asked => asked,
        };
        let place = match asked? {
            udp_bind::UdpBound::Granted(_) if forced => return Err(BindError::NoSharedMemory(server)),
            udp_bind::UdpBound::Granted(grant) => return Ok(Self::udp_binding(server, info, config, grant)),
            udp_bind::UdpBound::Rendezvous(place, proven) => (place, proven),
        };
        let (place, proven) = place;
        match shm::connect(server, &place).and_then(|stream| shm::bind(stream, info, &config)) {
            Ok(granted) => Ok(Self::assemble(
                server,
                info,
                config,
                Granted {
                    seal: None,
                    proven,
                    id: granted.id,
                    token: 0,
                    incarnation: granted.incarnation,
                    max_datagram: 0,
                    slots: granted.slots,
                    features: granted.features,
                    shm: Some(granted.link),
                    tcp: None,
                    procedures: granted.procedures,
                },
            )),
            // No shared memory to be had (the wrong process at the rendezvous, no room, a broken
            // connection or answer): over UDP instead, unless the address asked for shared memory
            // only. The binding keeps the reason, and one that binds again by itself tries shared
            // memory again.
            Err(
                e @ (BindError::SharedMemoryUnavailable { .. }
                | BindError::Busy
                | BindError::Protocol(_)
                | BindError::Io(_)),
            ) if !forced => {
                let mut binding = Self::bind_udp(server, info, config)?;
                if let Some(inner) = Arc::get_mut(&mut binding.inner) {
                    inner.shm_refused = Some(e.to_string());
                }
                Ok(binding)
            }
            Err(e) => Err(e),
        }
    }

    /// A binding over TCP, UDP having got no answer: the UDP error stands if no TCP server is
    /// there either.
    pub(super) fn fall_back_to_tcp(
        server: SocketAddr,
        info: &'static InterfaceInfo,
        config: ClientConfig,
    ) -> Result<Binding, BindError> {
        match Self::bind_tcp(server, info, config) {
            Err(BindError::NoServer(_) | BindError::Unreachable(_)) => Err(BindError::Unreachable(server)),
            bound => bound,
        }
    }

    pub(super) fn bind_tcp(
        server: SocketAddr,
        info: &'static InterfaceInfo,
        config: ClientConfig,
    ) -> Result<Binding, BindError> {
        let granted = tcp::bind(server, info, &config)?;
        let granted = Granted {
            seal: None,
            proven: granted.proven,
            id: granted.id,
            token: 0,
            incarnation: granted.incarnation,
            max_datagram: 0,
            slots: granted.slots,
            features: granted.features,
            shm: None,
            tcp: Some(granted.link),
            procedures: granted.procedures,
        };
        Ok(Self::assemble(server, info, config, granted))
    }

    /// A binding over UDP whose calls go through the AF_XDP station of the interface toward the
    /// server; over the kernel's UDP, saying why, when there is none.
    pub(super) fn bind_xdp(
        server: SocketAddr,
        info: &'static InterfaceInfo,
        config: ClientConfig,
    ) -> Result<Binding, BindError> {
        let mut binding = Self::bind_udp(server, info, config)?;
        let station = crate::xdp::station_for(server);
        if let Some(inner) = Arc::get_mut(&mut binding.inner) {
            match station {
                Ok(station) => inner.xdp = Some(station),
                Err(why) => inner.xdp_refused = Some(why),
            }
        }
        Ok(binding)
    }

    pub(super) fn bind_udp(
        server: SocketAddr,
        info: &'static InterfaceInfo,
        config: ClientConfig,
    ) -> Result<Binding, BindError> {
        match udp_bind::bind_udp(server, info, &config, false)? {
            udp_bind::UdpBound::Granted(grant) => Ok(Self::udp_binding(server, info, config, grant)),
            // Never the answer to a request that did not ask for it (the bind machine ignores it).
            udp_bind::UdpBound::Rendezvous(..) => Err(BindError::Protocol(crate::error::Violation::BindAnswer(
                "a rendezvous answered a request that did not ask for one",
            ))),
        }
    }

    pub(super) fn udp_binding(
        server: SocketAddr,
        info: &'static InterfaceInfo,
        config: ClientConfig,
        grant: udp_bind::UdpGrant,
    ) -> Binding {
        let udp_bind::UdpGrant { granted, max_datagram, seal } = grant;
        let granted = Granted {
            proven: seal.as_ref().map(|s| s.peer()),
            seal,
            id: granted.binding,
            token: granted.token,
            incarnation: granted.incarnation,
            max_datagram,
            slots: granted.grant.slots,
            features: granted.grant.features,
            shm: None,
            tcp: None,
            procedures: granted.procedures,
        };
        Self::assemble(server, info, config, granted)
    }

    /// The binding a bind exchange granted, on whichever transport.
    pub(super) fn assemble(
        server: SocketAddr,
        info: &'static InterfaceInfo,
        config: ClientConfig,
        granted: Granted,
    ) -> Binding {
        let deadline = config.deadline;
        let metrics = crate::metrics::procedures(info, "client", Some(server.to_string()), config.metrics);
        let plain =
            granted.shm.is_some() && granted.procedures.is_none() && config.interceptor.is_none() && metrics.is_empty();
        Binding {
            inner: Arc::new(BindingInner {
                uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
                server,
                id: granted.id,
                token: granted.token,
                incarnation: granted.incarnation,
                max_datagram: granted.max_datagram,
                free_slots: super::slots::Slots::new(granted.slots),
                slot_count: granted.slots,
                udp_port: std::sync::OnceLock::new(),
                udp_threads: std::sync::atomic::AtomicUsize::new(0),
                shm: granted.shm,
                tcp: granted.tcp,
                config,
                info,
                stats: Arc::default(),
                shm_refused: None,
                xdp: None,
                xdp_refused: None,
                features: granted.features,
                metrics,
                procedures: granted.procedures.map(Vec::into_boxed_slice),
                #[cfg(feature = "async")]
                asynch: Default::default(),
                seal: granted.seal,
                proven: granted.proven,
                onc: None,
                plain,
            }),
            deadline,
            rebind: None,
        }
    }

    /// A binding to an ONC server through `link`: no tiercel binding behind it (no slots, token
    /// or incarnation), only the link the stub's calls take.
    pub(crate) fn to_onc(link: Arc<crate::onc::Link>, info: &'static InterfaceInfo) -> Binding {
        let server = link.server();
        let granted = Granted {
            proven: None,
            seal: None,
            id: 0,
            token: 0,
            incarnation: 0,
            max_datagram: 0,
            slots: 0,
            features: 0,
            shm: None,
            tcp: None,
            procedures: None,
        };
        let mut binding = Self::assemble(server, info, ClientConfig::default(), granted);
        if let Some(inner) = Arc::get_mut(&mut binding.inner) {
            inner.onc = Some(link);
        }
        binding
    }
}
