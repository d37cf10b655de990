"""observe"""
