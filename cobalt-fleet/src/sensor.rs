//! The simulated readings: one value per quantity and device that moves one step per
//! change, differently on every device, deterministically (so tests know what comes).

/// What a simulated sensor measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// Degrees Celsius.
    Temperature,
    /// Relative humidity in percent.
    Humidity,
}

impl Quantity {
    /// Both, in the order a device keeps them (the index is the observable's number).
    pub const ALL: [Quantity; 2] = [Quantity::Temperature, Quantity::Humidity];

    /// Its index in [`Quantity::ALL`].
    pub fn index(self) -> usize {
        match self {
            Quantity::Temperature => 0,
            Quantity::Humidity => 1,
        }
    }
}

/// One sensor of one device: a slow wave around a base value that depends on the
/// device, one step per change, rounded to hundredths. Tracks the lowest and highest
/// value it has shown (LwM2M's Min and Max Measured Value).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sensor {
    base: f32,
    amplitude: f32,
    phase: u32,
    changes: u32,
    min: f32,
    max: f32,
}

impl Sensor {
    /// The sensor of `quantity` on device number `device`.
    pub fn new(quantity: Quantity, device: u32) -> Sensor {
        let (base, amplitude) = match quantity {
            Quantity::Temperature => (18.0 + (device % 8) as f32, 3.0),
            Quantity::Humidity => (40.0 + (device % 20) as f32, 10.0),
        };
        let mut s = Sensor {
            base,
            amplitude,
            phase: device.wrapping_mul(7) % 63,
            changes: 0,
            min: 0.0,
            max: 0.0,
        };
        let v = s.value();
        (s.min, s.max) = (v, v);
        s
    }

    /// The value now.
    pub fn value(&self) -> f32 {
        let angle = (self.phase.wrapping_add(self.changes) % 63) as f32 * 0.1;
        ((self.base + self.amplitude * angle.sin()) * 100.0).round() / 100.0
    }

    /// Moves one step; returns the new value.
    pub fn advance(&mut self) -> f32 {
        self.changes = self.changes.wrapping_add(1);
        let v = self.value();
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        v
    }

    /// How many steps it has moved (the observe sequence number of its resources).
    pub fn changes(&self) -> u32 {
        self.changes
    }

    /// The lowest value shown so far.
    pub fn min(&self) -> f32 {
        self.min
    }

    /// The highest value shown so far.
    pub fn max(&self) -> f32 {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_move_and_differ_between_devices() {
        let mut a = Sensor::new(Quantity::Temperature, 1);
        let b = Sensor::new(Quantity::Temperature, 2);
        assert_ne!(a.value(), b.value());
        let first = a.value();
        let second = a.advance();
        assert_ne!(first, second);
        assert_eq!(a.changes(), 1);
        assert!(a.min() <= first.min(second) && a.max() >= first.max(second));
        assert_eq!((a.value() * 100.0).fract(), 0.0, "rounded to hundredths");
    }
}
